-- For the rest of this transaction, the claim's statements run on their
-- generic plans. Their parameters (a worker's flows or NULL for all, the
-- throttled flows, the horizon) make every custom plan look cheaper than the
-- generic one, so PostgreSQL would plan the long claim statements anew on
-- every execution: measured at 3-8 ms of planning for a first look whose
-- generic plan runs in 0.6 ms. The generic plans walk the same indexes.
SET LOCAL plan_cache_mode = force_generic_plan
