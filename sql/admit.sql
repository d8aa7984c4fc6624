-- One admission decision for caller $1 (a SHA-256 key) of route class $2 and
-- tenant $3 ('' for anonymous callers): bucket of burst $4 and rate $5/s,
-- capacity $6 per window of $8 seconds, of which the tenant may take $7.
-- The statement is admit_caller() (migration 20261130000018): it locks the
-- bucket, the tenant's row and the class's row in that order and spends all
-- or nothing. `refused_by` is NULL when admitted; `tokens` the caller's bucket
-- after the decision.
SELECT a.refused_by, a.tokens AS "tokens!", a.db_now AS "db_now!",
       a.window_start AS "window_start!", a.window_end AS "window_end!"
FROM admit_caller($1::bytea, $2::text, $3::text, $4::float8, $5::float8,
                  $6::bigint, $7::bigint, $8::integer) a
