-- Calls that spend several quotas, decided in one statement, each all or
-- nothing across every window of every quota it spends: take_linked()
-- (sql/functions/take_linked.sql, which describes it). Leg i is of call
-- $1[i], quota $2[i], period $3[i], zone $4[i]: $5[i] slots against
-- ceiling $6[i]; $7: observe mode. One row per leg, in the order given.
SELECT t.o_call         AS "call!",
       t.o_db_now       AS "db_now!",
       -- The hour the clock is in: decisions are tallied per hour.
       window_start_of(t.o_db_now) AS "hour_start!",
       window_end_of(t.o_db_now)   AS "hour_end!",
       t.o_granted      AS "granted!",
       t.o_fits         AS "fits!",
       t.o_window_start AS "window_start!",
       t.o_window_end   AS "window_end!",
       t.o_count_before AS "count_before!"
FROM take_linked($1::integer[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                 $6::bigint[], $7::boolean) AS t
