-- For flows still in observe mode (of quota $1, or all), per hour of the last
-- $2 hours: the flow's decisions and would-defers (exact at the quotas' own
-- ceilings; the what-if report estimates other ceilings from the windows'
-- counts, sql/report_windows.sql).
SELECT f.name                      AS "flow!",
       f.quota                     AS "quota!",
       d.window_start              AS "window_start!",
       d.granted                   AS "decisions!",
       d.would_defer               AS "would_defer!",
       d.would_defer_with_deadline AS "would_defer_with_deadline!"
FROM flow f
JOIN decision_tally d ON d.flow = f.name AND d.quota = f.quota
WHERE f.mode = 'observe'
  AND ($1::text IS NULL OR f.quota = $1)
  AND d.window_start > window_start_of(arbiter_now()) - make_interval(hours => $2::int)
ORDER BY f.name, d.window_start
