-- Records reservation $1 (an unguessable id the caller settles with) of
-- $4 slots of quota $2 by flow $3, taken from the windows of periods $5
-- (starts $6, ends $7), by key $8 (NULL: none).
INSERT INTO reservation (id, quota, flow, estimated, periods, window_starts, window_ends, key_id)
VALUES (new_lease_id(), $1, $2, $3, $4, $5, $6, $7)
RETURNING id
