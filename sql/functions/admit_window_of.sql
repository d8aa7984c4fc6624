-- The start of the admission window of `seconds` (dividing an hour) that `ts`
-- is in: aligned on the UTC hour, so every replica and every class agree
-- (window_start_of() says why the body goes through UTC wall time: so the
-- planner can inline it).
CREATE OR REPLACE FUNCTION admit_window_of(ts timestamptz, seconds integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (window_start_of(ts) AT TIME ZONE 'UTC'
            + make_interval(secs => floor(extract(epoch FROM ts - window_start_of(ts)) / seconds) * seconds))
           AT TIME ZONE 'UTC'
$$;
