-- Current usage per quota and window (the quota_usage view) with the cadence
-- in force: what the dashboard and the state gauges show. Windows shortest
-- first (a month after every period of seconds).
SELECT u.quota           AS "quota!",
       u.period          AS "period!",
       u.window_start    AS "window_start!",
       u.window_end      AS "window_end!",
       u.count           AS "count!",
       u.ceiling         AS "ceiling!",
       u.percent_used::float8 AS "percent_used?",
       u.slots_left      AS "slots_left!",
       u.seconds_left    AS "seconds_left!",
       c.effective_rate  AS "effective_rate?",
       c.effective_burst AS "effective_burst?"
FROM quota_usage u
LEFT JOIN quota_cadence c ON c.quota = u.quota
ORDER BY u.quota, coalesce(period_seconds(u.period), 9999999999)
