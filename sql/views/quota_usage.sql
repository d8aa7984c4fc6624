-- Current usage per quota and window (one row per window the quota declares):
-- count, ceiling, percent used, seconds left in the window. `hourly_ceiling`
-- is the quota's `1h` window's ceiling (NULL without an hour).
CREATE OR REPLACE VIEW quota_usage AS
SELECT p.quota,
       p.period,
       p.zone,
       b.window_start,
       b.window_end,
       coalesce(w.count, 0)                     AS count,
       p.ceiling,
       h.ceiling                                AS hourly_ceiling,
       CASE WHEN p.ceiling > 0
            THEN round(100.0 * coalesce(w.count, 0) / p.ceiling, 1) END AS percent_used,
       greatest(0, p.ceiling - coalesce(w.count, 0)) AS slots_left,
       ceil(extract(epoch FROM b.window_end - arbiter_now()))::int AS seconds_left
FROM quota_period p
CROSS JOIN LATERAL (
    SELECT window_start_of(arbiter_now(), p.period, p.zone) AS window_start,
           window_end_of(arbiter_now(), p.period, p.zone)   AS window_end
) b
LEFT JOIN quota_period h ON h.quota = p.quota AND h.period = '1h'
LEFT JOIN quota_window w
       ON w.quota = p.quota AND w.period = p.period AND w.window_start = b.window_start;
