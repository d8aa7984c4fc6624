-- Current usage per quota (the quota_usage view): what the dashboard and the
-- window gauges show.
SELECT quota           AS "quota!",
       window_start    AS "window_start!",
       count           AS "count!",
       hourly_ceiling  AS "hourly_ceiling!",
       percent_used::float8 AS "percent_used?",
       slots_left      AS "slots_left!",
       seconds_left    AS "seconds_left!"
FROM quota_usage
ORDER BY quota
