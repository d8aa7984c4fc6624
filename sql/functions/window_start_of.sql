-- The one place a window boundary is computed: fixed, calendar-aligned UTC
-- hours, whatever the server's or the session's TimeZone.
--
-- window_start_of(), window_end_of() and admit_window_of() are IMMUTABLE, and
-- so must every step of their bodies be: the planner inlines a SQL function
-- only when its body is no more volatile than its declaration.
-- date_trunc(text, timestamptz, text) and timestamptz + interval are STABLE
-- (they depend on the session's TimeZone), so an earlier body that used them
-- ran through the SQL-function executor on every call; every deciding
-- statement reads its window's bounds, and the clock part of the budget
-- statement took about 55 µs of the statement's 150, inlined 4 (measured on
-- one connection, 2026-12-01, this project's CI machine kind). Converting to
-- UTC wall time first keeps every step IMMUTABLE: timezone(text, timestamptz),
-- date_trunc(text, timestamp) and timestamp + interval do not depend on the
-- session's TimeZone.
CREATE OR REPLACE FUNCTION window_start_of(ts timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('hour', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;
