-- What happened in each quota's recent windows, by outcome (tallies per hour)?
SELECT quota, period, window_start, count, ceiling, over_ceiling,
       granted, deferred, would_defer, bypassed, unthrottled
FROM quota_recent_windows
ORDER BY quota, period, window_start DESC;
