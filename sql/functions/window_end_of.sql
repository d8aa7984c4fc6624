-- The end of the UTC hour `ts` is in (window_start_of() says why the body
-- goes through UTC wall time: so the planner can inline it).
CREATE OR REPLACE FUNCTION window_end_of(ts timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (window_start_of(ts) AT TIME ZONE 'UTC' + interval '1 hour') AT TIME ZONE 'UTC'
$$;
