-- For flows still in observe mode: per hour, how many decisions would
-- enforcement have deferred, and how many of those carried a deadline?
SELECT flow, quota, window_start, decisions, would_defer, would_defer_with_deadline
FROM observe_would_defer
WHERE would_defer > 0
ORDER BY window_start DESC, would_defer DESC;
