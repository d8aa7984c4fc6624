-- Take up to $2 slots of quota $1 in the current window against ceiling $3:
-- least(k, what is left), in one conditional upsert. "taken" (0 when the
-- window is full: zero rows back) travels back through `last_take`, because
-- RETURNING only sees the new row. The caller guards ceiling < 1 before this
-- statement; the insert branch refuses it too.
WITH clock AS (
    SELECT window_start_of(arbiter_now()) AS window_start,
           window_end_of(arbiter_now())   AS window_end,
           arbiter_now()                  AS db_now
), taken AS (
    INSERT INTO quota_window AS w (quota, window_start, count, last_take)
    SELECT $1::text, clock.window_start, least($2::bigint, $3::bigint), least($2::bigint, $3::bigint)
    FROM clock
    WHERE $2::bigint >= 1 AND $3::bigint >= 1
    ON CONFLICT (quota, window_start) DO UPDATE
        SET count     = w.count + least($2::bigint, $3::bigint - w.count),
            last_take = least($2::bigint, $3::bigint - w.count)
        WHERE w.count < $3::bigint
    RETURNING w.count, w.last_take
)
SELECT clock.window_start                         AS "window_start!",
       clock.window_end                           AS "window_end!",
       clock.db_now                               AS "db_now!",
       (SELECT count FROM taken)                  AS "count_after?",
       coalesce((SELECT last_take FROM taken), 0) AS "taken!"
FROM clock
