-- What happened in each quota's last 24 windows, by outcome?
SELECT quota, window_start, count, hourly_ceiling, over_ceiling,
       granted, deferred, would_defer, bypassed, unthrottled
FROM quota_recent_windows
ORDER BY quota, window_start DESC;
