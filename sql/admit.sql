-- Admission decisions for a group of requests of route class $3: request i is
-- caller $1[i] (a SHA-256 bucket key) of tenant $2[i] ('' for anonymous
-- callers), in that order; buckets of burst $4 and rate $5/s, capacity $6 per
-- window of $8 seconds, of which one tenant may take $7. The statement is
-- admit_callers() (sql/functions/admit_callers.sql): it takes the class's lock,
-- reads the buckets, tenant rows and the class's row, decides each request
-- all or nothing and writes each row it changed once.
-- One row per request, in request order: `refused_by` NULL when admitted;
-- `tokens` the caller's bucket after its decision.
SELECT a.refused_by, a.tokens AS "tokens!", a.db_now AS "db_now!",
       a.window_start AS "window_start!", a.window_end AS "window_end!"
FROM admit_callers($1::bytea[], $2::text[], $3::text, $4::float8, $5::float8,
                   $6::bigint, $7::bigint, $8::integer) a
