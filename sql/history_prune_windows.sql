-- Deletes up to $2 windows that ended more than $1 seconds ago (database
-- clock), oldest first; a current window has not ended, so it is never
-- touched. A window's end is bounded by its start and its period (a month
-- by 31 days, a day in a zone by 25 hours). Replicas prune concurrently:
-- rows another one is deleting are skipped, not waited for.
DELETE FROM quota_window
WHERE (quota, period, window_start) IN (
    SELECT quota, period, window_start FROM quota_window
    WHERE window_start < arbiter_now() - make_interval(secs => $1::float8)
                         - CASE period WHEN '1mo' THEN interval '31 days'
                                       WHEN '1d' THEN interval '25 hours'
                                       ELSE make_interval(secs => period_seconds(period)) END
    ORDER BY window_start
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
