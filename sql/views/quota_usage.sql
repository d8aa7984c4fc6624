-- Current usage per quota: count, ceiling, percent used, seconds left in the window.
CREATE OR REPLACE VIEW quota_usage AS
SELECT q.name                                   AS quota,
       window_start_of(arbiter_now())           AS window_start,
       coalesce(w.count, 0)                     AS count,
       q.hourly_ceiling,
       CASE WHEN q.hourly_ceiling > 0
            THEN round(100.0 * coalesce(w.count, 0) / q.hourly_ceiling, 1) END AS percent_used,
       greatest(0, q.hourly_ceiling - coalesce(w.count, 0)) AS slots_left,
       ceil(extract(epoch FROM window_end_of(arbiter_now()) - arbiter_now()))::int AS seconds_left
FROM quota q
LEFT JOIN quota_window w ON w.quota = q.name AND w.window_start = window_start_of(arbiter_now());
