-- For the rest of this transaction, the claim's statements run on generic
-- plans that walk their indexes, whatever the table's statistics say.
-- plan_cache_mode: their parameters (a worker's flows or NULL for all, the
-- throttled flows, the horizon) make every custom plan look cheaper than the
-- generic one, so PostgreSQL would plan the long claim statements anew on
-- every execution: measured at 3-8 ms of planning for a first look whose
-- generic plan runs in 0.6 ms.
-- enable_bitmapscan: a backlog enqueued faster than autovacuum analyzes the
-- table looks like a few rows to the planner, which then reads a flow's whole
-- backlog through a bitmap and sorts it instead of walking the pending index
-- in rationing order and stopping at the claim's size: measured at 161 ms
-- against 0.4 ms for 180,000 items just enqueued (2026-12-01).
-- enable_seqscan: a generic plan is kept for as long as the connection lives,
-- and one made while the registry was empty (a new deployment, a new queue)
-- reads the whole table instead of its indexes once it has grown: a hash join
-- over every row to lease 30 items, until a vacuum or an analyze happens to
-- invalidate the plan. Every walk of the claim has an index in its own order
-- or looks rows up by key.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode,
       set_config('enable_bitmapscan', 'off', true) AS enable_bitmapscan,
       set_config('enable_seqscan', 'off', true) AS enable_seqscan
