-- Records a reservation (an unguessable id the caller settles with) by flow
-- $2 of $3[i] slots of quota $1[i], a row per quota under one id, each with
-- the windows it was taken from: window j is of quota $4[j], period $5[j],
-- starting $6[j] and ending $7[j]. By key $8 (NULL: none).
WITH reservation_id AS (
    SELECT new_lease_id() AS id
)
INSERT INTO reservation (id, quota, position, flow, estimated, periods, window_starts, window_ends, key_id)
SELECT r.id, q.quota, q.position, $2, q.estimated,
       coalesce(array_agg(w.period ORDER BY w.n) FILTER (WHERE w.n IS NOT NULL), '{}'),
       coalesce(array_agg(w.window_start ORDER BY w.n) FILTER (WHERE w.n IS NOT NULL), '{}'),
       coalesce(array_agg(w.window_end ORDER BY w.n) FILTER (WHERE w.n IS NOT NULL), '{}'),
       $8
FROM reservation_id r
CROSS JOIN unnest($1::text[], $3::bigint[]) WITH ORDINALITY AS q (quota, estimated, position)
LEFT JOIN unnest($4::text[], $5::text[], $6::timestamptz[], $7::timestamptz[])
          WITH ORDINALITY AS w (quota, period, window_start, window_end, n)
       ON w.quota = q.quota
GROUP BY r.id, q.quota, q.position, q.estimated
RETURNING id
