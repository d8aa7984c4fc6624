-- Core arbiter schema: quotas, flows, hourly windows and decision tallies.

-- The database clock. Everything time-dependent reads this, never the caller's
-- or the replica's clock. `quota_arbiter.clock_offset` (an interval, normally
-- unset) lets tests move the clock of one database, e.g. with
-- ALTER DATABASE ... SET quota_arbiter.clock_offset = '25 minutes'.
CREATE FUNCTION arbiter_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + coalesce(nullif(current_setting('quota_arbiter.clock_offset', true), '')::interval,
                            interval '0')
$$;

-- The one place a window boundary is computed: fixed, calendar-aligned UTC hours,
-- whatever the server's or the session's TimeZone.
CREATE FUNCTION window_start_of(ts timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('hour', ts, 'UTC')
$$;

CREATE FUNCTION window_end_of(ts timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT window_start_of(ts) + interval '1 hour'
$$;

CREATE TABLE quota (
    name           text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    -- Bounded so that count + k can never overflow.
    hourly_ceiling bigint NOT NULL CHECK (hourly_ceiling <= 9007199254740992),
    created_at     timestamptz NOT NULL DEFAULT arbiter_now(),
    updated_at     timestamptz NOT NULL DEFAULT arbiter_now()
);

CREATE TABLE flow (
    name       text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    quota      text NOT NULL REFERENCES quota (name),
    mode       text NOT NULL DEFAULT 'observe' CHECK (mode IN ('observe', 'enforce', 'count')),
    priority   smallint NOT NULL DEFAULT 2 CHECK (priority BETWEEN 1 AND 9),
    created_at timestamptz NOT NULL DEFAULT arbiter_now(),
    updated_at timestamptz NOT NULL DEFAULT arbiter_now()
);

CREATE INDEX flow_quota_idx ON flow (quota);

-- One row per quota and UTC hour. `count` is the honest record of every slot
-- spent in the window by any path (granted, observed over the ceiling,
-- bypassed, counted), so count > ceiling stays visible in SQL.
CREATE TABLE quota_window (
    quota        text NOT NULL REFERENCES quota (name),
    window_start timestamptz NOT NULL,
    count        bigint NOT NULL DEFAULT 0 CHECK (count >= 0),
    PRIMARY KEY (quota, window_start)
);

-- Decisions per window, quota and flow, by outcome. Written in batches off the
-- hot path; observation only. `quota` is NULL for flows the arbiter does not know.
CREATE TABLE decision_tally (
    window_start timestamptz NOT NULL,
    quota        text,
    flow         text NOT NULL,
    granted      bigint NOT NULL DEFAULT 0,
    deferred     bigint NOT NULL DEFAULT 0,
    would_defer  bigint NOT NULL DEFAULT 0,
    bypassed     bigint NOT NULL DEFAULT 0,
    unthrottled  bigint NOT NULL DEFAULT 0,
    CONSTRAINT decision_tally_key UNIQUE NULLS NOT DISTINCT (window_start, quota, flow)
);
