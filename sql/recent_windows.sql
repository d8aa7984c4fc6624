-- Windows that started in the last $2 hours (the current ones included) of
-- quota $1, or of every quota when $1 is NULL, newest first, with the
-- quota's ceiling for the period and, for hours, decision tallies summed
-- over flows (decisions are tallied per UTC hour).
SELECT w.quota          AS "quota!",
       w.period         AS "period!",
       w.window_start   AS "window_start!",
       w.count          AS "count!",
       p.ceiling        AS "ceiling?",
       q.hourly_ceiling AS "hourly_ceiling?",
       coalesce(t.granted, 0)     AS "granted!",
       coalesce(t.deferred, 0)    AS "deferred!",
       coalesce(t.would_defer, 0) AS "would_defer!",
       coalesce(t.bypassed, 0)    AS "bypassed!",
       coalesce(t.unthrottled, 0) AS "unthrottled!"
FROM quota_window w
JOIN quota q ON q.name = w.quota
LEFT JOIN quota_period p ON p.quota = w.quota AND p.period = w.period
LEFT JOIN LATERAL (
    SELECT sum(d.granted)::bigint AS granted, sum(d.deferred)::bigint AS deferred,
           sum(d.would_defer)::bigint AS would_defer, sum(d.bypassed)::bigint AS bypassed,
           sum(d.unthrottled)::bigint AS unthrottled
    FROM decision_tally d
    WHERE w.period = '1h' AND d.quota = w.quota AND d.window_start = w.window_start
) t ON true
WHERE ($1::text IS NULL OR w.quota = $1)
  AND w.window_start > window_start_of(arbiter_now()) - make_interval(hours => $2::int)
ORDER BY w.window_start DESC, w.quota, w.period
