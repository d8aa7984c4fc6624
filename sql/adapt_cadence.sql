-- Upstream feedback for quota $1, whose upstream answered status $2: multiply
-- its adaptive factor (recovered to now first) by the status's multiplier
-- (upstream_multiplier; a status without one changes nothing and returns no
-- row), never above 1 nor below the factor that keeps the rate at 0.01/s.
-- Quotas with adaptive = false are left alone. The effective rate is at
-- least 0.01/s, never above the configured one (client/src/adapt.rs).
UPDATE quota_bucket b
SET factor = least(1.0, greatest(least(1.0, 0.01 / q.rate),
                                 recovered_factor(b.factor, b.factor_at) * upstream_multiplier($2))),
    factor_at = greatest(b.factor_at, arbiter_now())
FROM quota q
WHERE b.quota = $1 AND q.name = b.quota AND q.adaptive AND upstream_multiplier($2) IS NOT NULL
RETURNING b.factor AS "factor!",
          least(q.rate, greatest(0.01, q.rate * b.factor)) AS "effective_rate!",
          greatest(1.0, q.burst * b.factor) AS "effective_burst!"
