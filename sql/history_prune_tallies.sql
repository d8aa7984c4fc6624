-- Deletes up to $2 decision tallies of windows that ended more than $1 seconds
-- ago (database clock), oldest first, the same cut as the windows. Rows are
-- picked by ctid: the key has a nullable column (unknown flows' quota).
DELETE FROM decision_tally
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM decision_tally
    WHERE window_start < arbiter_now() - make_interval(secs => $1::float8) - interval '1 hour'
    ORDER BY window_start
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))
