-- Reservations past their time to settle ($1 seconds) by an hour, a batch of
-- $2 at a time: settled or not, nothing can change them any more.
DELETE FROM reservation
WHERE id IN (
    SELECT id FROM reservation
    WHERE reserved_at < arbiter_now() - make_interval(secs => $1::float8) - interval '1 hour'
    ORDER BY reserved_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
