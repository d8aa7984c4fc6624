-- Which flows are spending the most this hour?
SELECT flow, quota,
       granted + deferred + bypassed + unthrottled AS decisions,
       granted, deferred, would_defer, bypassed, unthrottled
FROM decision_tally
WHERE window_start = window_start_of(arbiter_now())
ORDER BY decisions DESC
LIMIT 20;
