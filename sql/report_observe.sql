-- For flows still in observe mode (of quota $1, or all), per hour of the last $2
-- hours: the flow's decisions and would-defers, and its quota's window count
-- (slots spent by every path: the base of what-if estimates) for that hour:
-- the quota's `1h` window (0 for a quota without an hour).
SELECT f.name                      AS "flow!",
       f.quota                     AS "quota!",
       d.window_start              AS "window_start!",
       d.granted                   AS "decisions!",
       d.would_defer               AS "would_defer!",
       d.would_defer_with_deadline AS "would_defer_with_deadline!",
       coalesce(w.count, 0)        AS "window_count!"
FROM flow f
JOIN decision_tally d ON d.flow = f.name AND d.quota = f.quota
LEFT JOIN quota_window w ON w.quota = f.quota AND w.period = '1h' AND w.window_start = d.window_start
WHERE f.mode = 'observe'
  AND ($1::text IS NULL OR f.quota = $1)
  AND d.window_start > window_start_of(arbiter_now()) - make_interval(hours => $2::int)
ORDER BY f.name, d.window_start
