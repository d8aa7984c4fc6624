-- Takes for groups of asks on paced quotas, one group per quota, in one
-- statement: take_paced_across() (sql/functions/take_paced_across.sql,
-- which describes it). Quota i of
-- $1 asks $9[$2[i]:$3[i]] (slots, in rationing order) for the flows
-- $10[$2[i]:$3[i]], against the highest ceiling $4[i] among them; $5[i]:
-- every ask needs an in-flight place; cadence rate $6[i] and burst $7[i]
-- (NULL: none), adaptive when $8[i]; $11: observe mode. One row per quota,
-- `quota_index` its position in $1 (from 1).
SELECT t.o_quota_index        AS "quota_index!",
       t.o_window_start       AS "window_start!",
       t.o_window_end         AS "window_end!",
       t.o_db_now             AS "db_now!",
       t.o_count_before       AS "count_before!",
       t.o_count_after        AS "count_after?",
       t.o_taken              AS "taken!",
       t.o_tokens_bound       AS "tokens_bound!",
       t.o_places_bound       AS "places_bound!",
       t.o_tokens             AS "tokens?",
       t.o_rate               AS "rate?",
       t.o_lease_ids          AS "lease_ids!",
       t.o_lease_valid_until  AS "lease_valid_until!",
       t.o_lease_asks         AS "lease_asks!",
       t.o_first_lease_expiry AS "first_lease_expiry?"
FROM take_paced_across($1::text[], $2::integer[], $3::integer[], $4::bigint[],
                       $5::boolean[], $6::float8[], $7::float8[], $8::boolean[],
                       $9::bigint[], $10::text[], $11::boolean) AS t
