-- The benchmark's baseline: the bare conditional upsert that every deciding
-- statement of the service is built around (sql/functions/take_windows.sql
-- and take_paced_across.sql add the take-up-to-k, stacked windows, several
-- quotas, cadence and places). Reserve $2 slots of
-- quota $1 in its current hour, all or nothing, against ceiling $3: zero
-- rows back from the upsert is the refusal ("count_after" is NULL); with
-- $4 = true the slots are spent regardless. pgbench replays it with its
-- parameters bound as literals. The window and the clock come from the
-- database, never from the caller.
WITH clock AS (
    SELECT window_start_of(arbiter_now()) AS window_start,
           window_end_of(arbiter_now())   AS window_end,
           arbiter_now()                  AS db_now
), reserved AS (
    INSERT INTO quota_window AS w (quota, period, window_start, count)
    SELECT $1::text, '1h', clock.window_start, $2::bigint
    FROM clock
    WHERE $4::boolean OR $2::bigint <= $3::bigint
    ON CONFLICT (quota, period, window_start) DO UPDATE
        SET count = w.count + EXCLUDED.count
        WHERE $4::boolean OR w.count + EXCLUDED.count <= $3::bigint
    RETURNING w.count
)
SELECT clock.window_start          AS "window_start!",
       clock.window_end            AS "window_end!",
       clock.db_now                AS "db_now!",
       (SELECT count FROM reserved) AS "count_after?"
FROM clock
