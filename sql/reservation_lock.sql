-- Reservation $1, a row per quota in the flow's order, locked until its settlement commits,
-- and whether its time to settle ($2 seconds from when it was reserved, by
-- the database clock) is past.
SELECT quota, flow, estimated, periods, window_starts, window_ends, key_id,
       settled_at,
       reserved_at < arbiter_now() - make_interval(secs => $2::float8) AS "expired!"
FROM reservation
WHERE id = $1
ORDER BY position
FOR UPDATE
