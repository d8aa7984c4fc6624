-- Quotas with their limits and the effective (adaptive) cadence right now.
SELECT q.name, q.hourly_ceiling, q.rate, q.burst, q.adaptive, q.max_in_flight,
       q.priority2_share, q.priority3_share,
       -- greatest() skips NULLs: no cadence must stay NULL, not the floor. The
       -- floor is how far a cadence adapts down, never above the configured rate.
       CASE WHEN q.rate IS NOT NULL THEN least(q.rate, greatest(0.01, q.rate * f.factor)) END AS effective_rate,
       CASE WHEN q.burst IS NOT NULL THEN greatest(1.0, q.burst * f.factor) END AS effective_burst,
       q.created_at, q.updated_at
FROM quota q
LEFT JOIN LATERAL (
    SELECT CASE WHEN q.adaptive THEN recovered_factor(b.factor, b.factor_at) ELSE 1.0 END AS factor
    FROM quota_bucket b WHERE b.quota = q.name
) f ON true
WHERE $1::text IS NULL OR q.name = $1
ORDER BY q.name
