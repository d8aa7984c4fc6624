-- Every window counted for a quota that flows still in observe mode spend
-- (flows of quota $1, or all) and that overlaps the last $2 hours, with its
-- configured ceiling and where it ends: the observe report sums them per
-- window, and its what-if spreads each count over the hours it spans
-- (src/report.rs). Month windows start up to 31 days before the range.
WITH reported AS (
    SELECT DISTINCT q.name
    FROM flow f
    CROSS JOIN LATERAL unnest(array_prepend(f.quota, f.further_quotas)) AS q (name)
    WHERE f.mode = 'observe' AND ($1::text IS NULL OR f.quota = $1)
), since AS (
    SELECT window_start_of(arbiter_now()) - make_interval(hours => $2::int) AS at
)
SELECT w.quota                                        AS "quota!",
       w.period                                       AS "period!",
       w.window_start                                 AS "window_start!",
       window_end_of(w.window_start, w.period, p.zone) AS "ends_at!",
       w.count                                        AS "count!"
FROM reported r
CROSS JOIN since
JOIN quota_period p ON p.quota = r.name
JOIN quota_window w ON w.quota = p.quota AND w.period = p.period
WHERE w.window_start > since.at - interval '32 days'
  AND window_end_of(w.window_start, w.period, p.zone) > since.at
ORDER BY w.quota, w.period, w.window_start
