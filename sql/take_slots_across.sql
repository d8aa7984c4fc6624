-- Take budget slots of several quotas in one statement: for each quota $1[i],
-- up to $2[i] slots against its ceiling $3[i] (least(k, what is left)), but
-- nothing when fewer than $4[i] are left — the smallest request of that
-- quota's group, so a lone request is all or nothing. Each row is its own
-- conditional upsert; rows are locked in quota order, so concurrent
-- statements (other replicas) wait on each other but never deadlock. "taken"
-- travels back through `last_take`, as in take_slots.sql. A quota whose row
-- took nothing is absent from the answer. A conflicting row finds its
-- quota's numbers by its position in $1 (names are distinct): a lookup in
-- the parameter arrays, where a subquery over `asked` rescanned the whole
-- group for every row and every number (a third of the database's CPU at a
-- thousand quotas).
WITH clock AS (
    SELECT window_start_of(arbiter_now()) AS window_start,
           window_end_of(arbiter_now())   AS window_end,
           arbiter_now()                  AS db_now
), asked AS (
    SELECT a.quota, a.wanted, a.ceiling, a.smallest
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
         AS a (quota, wanted, ceiling, smallest)
), taken AS (
    INSERT INTO quota_window AS w (quota, window_start, count, last_take)
    SELECT a.quota, c.window_start, least(a.wanted, a.ceiling), least(a.wanted, a.ceiling)
    FROM asked a, clock c
    WHERE a.wanted >= 1 AND a.smallest <= a.ceiling AND a.ceiling >= 1
    ORDER BY a.quota
    ON CONFLICT (quota, window_start) DO UPDATE
        SET count     = w.count + least(($2::bigint[])[array_position($1::text[], w.quota)],
                                        ($3::bigint[])[array_position($1::text[], w.quota)] - w.count),
            last_take = least(($2::bigint[])[array_position($1::text[], w.quota)],
                              ($3::bigint[])[array_position($1::text[], w.quota)] - w.count)
        WHERE w.count + ($4::bigint[])[array_position($1::text[], w.quota)]
              <= ($3::bigint[])[array_position($1::text[], w.quota)]
    RETURNING w.quota, w.count, w.last_take
)
SELECT c.window_start AS "window_start!", c.window_end AS "window_end!", c.db_now AS "db_now!",
       t.quota AS "quota?", t.count AS "count_after?", t.last_take AS "taken?"
FROM clock c
LEFT JOIN taken t ON true
