-- The adaptive cadence's reading of an upstream's HTTP status (0: the call
-- timed out): back off hard on 429 (x0.7), gently on a timeout (x0.8) or
-- another 5xx (x0.9), creep back up on a success (x1.05); other answers (a
-- 404, a redirect) say nothing about the rate: NULL. The arbiter's one copy
-- of the rule (sql/adapt_cadence.sql); the worker client's local fallback
-- adapts by its own (client/src/adapt.rs, `multiplier`), which
-- tests/it/client.rs holds equal to this for every status.
CREATE OR REPLACE FUNCTION upstream_multiplier(status integer) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN status = 429 THEN 0.7
        WHEN status = 0 THEN 0.8
        WHEN status BETWEEN 500 AND 599 THEN 0.9
        WHEN status BETWEEN 200 AND 299 THEN 1.05
    END::float8
$$;
