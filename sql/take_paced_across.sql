-- Takes for groups of asks on paced quotas, one group per quota, in one
-- call: take_paced_across() (sql/functions/take_paced_across.sql, which
-- describes it). Quota i of $1 asks $8[$2[i]:$3[i]] (slots, in rationing
-- order) for the flows $9[$2[i]:$3[i]]; $4[i]: every ask needs an in-flight
-- place; cadence rate $5[i] and burst $6[i] (NULL: none), adaptive when
-- $7[i]; window j ($10..$13) is of quota $10[j], period $11[j], zone $12[j],
-- ceiling $13[j]; $14: observe mode. One row per quota, `quota_index` its
-- position in $1 (from 1).
SELECT t.o_quota_index        AS "quota_index!",
       t.o_db_now             AS "db_now!",
       -- The hour the clock is in: decisions are tallied per hour.
       window_start_of(t.o_db_now) AS "window_start!",
       window_end_of(t.o_db_now)   AS "window_end!",
       t.o_taken              AS "taken!",
       t.o_window_starts      AS "window_starts!",
       t.o_window_ends        AS "window_ends!",
       t.o_counts_before      AS "counts_before!",
       t.o_tokens_bound       AS "tokens_bound!",
       t.o_places_bound       AS "places_bound!",
       t.o_tokens             AS "tokens?",
       t.o_rate               AS "rate?",
       t.o_lease_ids          AS "lease_ids!",
       t.o_lease_valid_until  AS "lease_valid_until!",
       t.o_lease_asks         AS "lease_asks!",
       t.o_first_lease_expiry AS "first_lease_expiry?",
       t.o_typical_hold       AS "typical_hold?"
FROM take_paced_across($1::text[], $2::integer[], $3::integer[], $4::boolean[],
                       $5::float8[], $6::float8[], $7::boolean[], $8::bigint[], $9::text[],
                       $10::integer[], $11::text[], $12::text[], $13::bigint[], $14::boolean) AS t
