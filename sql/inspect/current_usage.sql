-- How full is each quota's window right now, and how long until it resets?
SELECT quota, window_start, count, hourly_ceiling, percent_used, slots_left, seconds_left
FROM quota_usage
ORDER BY percent_used DESC NULLS LAST;
