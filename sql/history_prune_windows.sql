-- Deletes up to $2 hourly windows that ended more than $1 seconds ago (database
-- clock), oldest first; the current window has not ended, so it is never
-- touched. Replicas prune concurrently: rows another one is deleting are
-- skipped, not waited for.
DELETE FROM quota_window
WHERE (quota, window_start) IN (
    SELECT quota, window_start FROM quota_window
    WHERE window_start < arbiter_now() - make_interval(secs => $1::float8) - interval '1 hour'
    ORDER BY window_start
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
