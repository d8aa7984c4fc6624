-- Per quota with cadence or in-flight places: configured and effective
-- (adaptive) rate and burst, tokens now, and leases held. A quota with only
-- `max_in_flight` has no bucket: its cadence columns are NULL.
-- The floors (0.01 token/s, a burst of 1) are how far a cadence adapts down,
-- never above what is configured: a quota configured slower keeps its rate
-- (the worker client's rule, client/src/adapt.rs; tests/it/rules.rs).
CREATE OR REPLACE VIEW quota_cadence AS
SELECT q.name AS quota, q.rate, q.burst, q.adaptive,
       f.factor,
       CASE WHEN b.quota IS NOT NULL THEN least(q.rate, greatest(0.01, q.rate * f.factor)) END AS effective_rate,
       CASE WHEN b.quota IS NOT NULL THEN greatest(1.0, q.burst * f.factor) END AS effective_burst,
       CASE WHEN b.quota IS NOT NULL THEN
           least(greatest(1.0, q.burst * f.factor),
                 b.tokens + least(q.rate, greatest(0.01, q.rate * f.factor))
                            * greatest(0, extract(epoch FROM arbiter_now() - b.refilled_at)))
       END AS tokens_now,
       q.max_in_flight,
       (SELECT count(*) FROM quota_place s
        WHERE s.quota = q.name AND s.valid_until > arbiter_now()) AS leases_held
FROM quota q
LEFT JOIN quota_bucket b ON b.quota = q.name
CROSS JOIN LATERAL (
    SELECT CASE WHEN b.quota IS NULL THEN NULL
                WHEN q.adaptive THEN recovered_factor(b.factor, b.factor_at)
                ELSE 1.0 END AS factor
) f
WHERE b.quota IS NOT NULL OR q.max_in_flight IS NOT NULL;
