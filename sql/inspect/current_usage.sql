-- How full is each window of each quota right now, and how long until it resets?
SELECT quota, period, window_start, count, ceiling, percent_used, slots_left, seconds_left
FROM quota_usage
ORDER BY percent_used DESC NULLS LAST;
