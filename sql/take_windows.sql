-- Budget takes across quotas with their stacked windows, all or nothing per
-- quota: take_windows() (sql/functions/take_windows.sql, which describes it).
-- Quota i of $1 wants $2[i] slots, no fewer than $3[i]; window j is of quota
-- $4[j], period $5[j], zone $6[j], ceiling $7[j]; $8: observe mode.
SELECT t.o_quota_index   AS "quota_index!",
       t.o_db_now        AS "db_now!",
       -- The hour the clock is in: decisions are tallied per hour.
       window_start_of(t.o_db_now) AS "window_start!",
       window_end_of(t.o_db_now)   AS "window_end!",
       t.o_taken         AS "taken!",
       t.o_window_starts AS "window_starts!",
       t.o_window_ends   AS "window_ends!",
       t.o_counts_before AS "counts_before!"
FROM take_windows($1::text[], $2::bigint[], $3::bigint[], $4::integer[], $5::text[],
                  $6::text[], $7::bigint[], $8::boolean) AS t
