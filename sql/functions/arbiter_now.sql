-- The database clock. Everything time-dependent reads this, never the caller's
-- or the replica's clock. `quota_arbiter.clock_offset` (an interval, normally
-- unset) lets tests move the clock of one database, e.g. with
-- ALTER DATABASE ... SET quota_arbiter.clock_offset = '25 minutes'.
-- Column defaults of the tables call it (migrations/).
CREATE OR REPLACE FUNCTION arbiter_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + coalesce(nullif(current_setting('quota_arbiter.clock_offset', true), '')::interval,
                            interval '0')
$$;
