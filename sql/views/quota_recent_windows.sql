-- The last 24 windows per quota with decision tallies by outcome.
CREATE OR REPLACE VIEW quota_recent_windows AS
SELECT w.quota, w.window_start, w.count, q.hourly_ceiling,
       w.count > q.hourly_ceiling AS over_ceiling,
       coalesce(sum(d.granted), 0)::bigint     AS granted,
       coalesce(sum(d.deferred), 0)::bigint    AS deferred,
       coalesce(sum(d.would_defer), 0)::bigint AS would_defer,
       coalesce(sum(d.bypassed), 0)::bigint    AS bypassed,
       coalesce(sum(d.unthrottled), 0)::bigint AS unthrottled
FROM quota_window w
JOIN quota q ON q.name = w.quota
LEFT JOIN decision_tally d ON d.quota = w.quota AND d.window_start = w.window_start
WHERE w.window_start > window_start_of(arbiter_now()) - interval '24 hours'
GROUP BY w.quota, w.window_start, w.count, q.hourly_ceiling;
