-- Each quota's windows that started in the last 24 hours (a longer window:
-- the current one), with the quota's ceiling for the period and, for hours,
-- the decision tallies by outcome (decisions are tallied per UTC hour).
CREATE OR REPLACE VIEW quota_recent_windows AS
SELECT w.quota, w.period, w.window_start, w.count, p.ceiling,
       w.count > p.ceiling AS over_ceiling,
       coalesce(sum(d.granted), 0)::bigint     AS granted,
       coalesce(sum(d.deferred), 0)::bigint    AS deferred,
       coalesce(sum(d.would_defer), 0)::bigint AS would_defer,
       coalesce(sum(d.bypassed), 0)::bigint    AS bypassed,
       coalesce(sum(d.unthrottled), 0)::bigint AS unthrottled
FROM quota_window w
JOIN quota_period p ON p.quota = w.quota AND p.period = w.period
LEFT JOIN decision_tally d
       ON w.period = '1h' AND d.quota = w.quota AND d.window_start = w.window_start
WHERE w.window_start > window_start_of(arbiter_now()) - interval '24 hours'
   OR w.window_start = window_start_of(arbiter_now(), p.period, p.zone)
GROUP BY w.quota, w.period, w.window_start, w.count, p.ceiling;
