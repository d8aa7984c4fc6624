-- Quotas with their limits, their windows (shortest first: a month after
-- every period of seconds) and the effective (adaptive) cadence right now.
SELECT q.name, q.rate, q.burst, q.adaptive, q.max_in_flight,
       q.priority2_share, q.priority3_share,
       -- greatest() skips NULLs: no cadence must stay NULL, not the floor. The
       -- floor is how far a cadence adapts down, never above the configured rate.
       CASE WHEN q.rate IS NOT NULL THEN least(q.rate, greatest(0.01, q.rate * f.factor)) END AS effective_rate,
       CASE WHEN q.burst IS NOT NULL THEN greatest(1.0, q.burst * f.factor) END AS effective_burst,
       q.created_at, q.updated_at,
       coalesce(w.periods, '{}') AS "periods!", coalesce(w.ceilings, '{}') AS "ceilings!",
       coalesce(w.zones, '{}') AS "zones!: Vec<Option<String>>"
FROM quota q
LEFT JOIN LATERAL (
    SELECT CASE WHEN q.adaptive THEN recovered_factor(b.factor, b.factor_at) ELSE 1.0 END AS factor
    FROM quota_bucket b WHERE b.quota = q.name
) f ON true
LEFT JOIN LATERAL (
    SELECT array_agg(p.period ORDER BY coalesce(period_seconds(p.period), 9999999999)) AS periods,
           array_agg(p.ceiling ORDER BY coalesce(period_seconds(p.period), 9999999999)) AS ceilings,
           array_agg(p.zone ORDER BY coalesce(period_seconds(p.period), 9999999999)) AS zones
    FROM quota_period p WHERE p.quota = q.name
) w ON true
WHERE $1::text IS NULL OR q.name = $1
ORDER BY q.name
