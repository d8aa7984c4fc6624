-- Stacked windows (docs/design.md §2, §12): a quota declares one window per
-- period (a minute, an hour, a day in a zone, a month …), each with its own
-- ceiling, and `quota_window` counts one row per quota, period and start.
--
-- The hour a quota had becomes its `1h` window; the windows counted so far
-- were hours. `quota.hourly_ceiling` stays, as the `1h` window's ceiling
-- (NULL: the quota has no hour): the two are kept equal by triggers both
-- ways, so SQL that reads or writes `hourly_ceiling` keeps working. Replicas
-- of an older release cannot decide on this schema (their statements name
-- the old key of quota_window): upgrade every replica together
-- (docs/operations/upgrades.md).

-- The views read what this changes; step 3 of the migrate makes them again.
DROP VIEW IF EXISTS work_waiting_by_flow, work_oldest_pending, work_past_deadline,
    work_pending_by_flow, quota_cadence, bypasses_by_hour, observe_would_defer,
    quota_recent_windows, quota_usage;

-- A quota's windows: one row per period. `period` divides a day evenly
-- (`1s` … `1d`: period_seconds() reads it) or is `1mo`; `zone` (an IANA
-- name PostgreSQL knows; NULL: UTC) only for `1d` and `1mo`, whose windows
-- start at the zone's local midnight.
CREATE TABLE quota_period (
    quota   text NOT NULL REFERENCES quota (name) ON DELETE CASCADE,
    period  text NOT NULL CHECK (period = '1mo' OR 86400 % period_seconds(period) = 0),
    -- Bounded so that count + k can never overflow.
    ceiling bigint NOT NULL CHECK (ceiling BETWEEN 0 AND 9007199254740992),
    -- timezone() raises on a zone PostgreSQL does not know.
    zone    text CHECK (zone IS NULL
                        OR (period IN ('1d', '1mo')
                            AND timezone(zone, timestamptz '2000-01-01 00:00:00+00') IS NOT NULL)),
    PRIMARY KEY (quota, period)
);

INSERT INTO quota_period (quota, period, ceiling)
SELECT name, '1h', hourly_ceiling FROM quota;

ALTER TABLE quota ALTER COLUMN hourly_ceiling DROP NOT NULL;

CREATE TRIGGER quota_period_audit AFTER INSERT OR UPDATE OR DELETE ON quota_period
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();
CREATE TRIGGER quota_hour_window AFTER INSERT OR UPDATE OF hourly_ceiling ON quota
    FOR EACH ROW EXECUTE FUNCTION quota_hour_to_window();
CREATE TRIGGER quota_period_hour AFTER INSERT OR UPDATE OR DELETE ON quota_period
    FOR EACH ROW EXECUTE FUNCTION window_to_quota_hour();

-- Every window counted so far was an hour.
ALTER TABLE quota_window ADD COLUMN period text NOT NULL DEFAULT '1h';
ALTER TABLE quota_window ALTER COLUMN period DROP DEFAULT;
ALTER TABLE quota_window DROP CONSTRAINT quota_window_pkey;
ALTER TABLE quota_window ADD PRIMARY KEY (quota, period, window_start);

-- take_paced_across() takes each window's period, zone and ceiling now.
DROP FUNCTION IF EXISTS take_paced_across(text[], integer[], integer[], bigint[], boolean[],
    double precision[], double precision[], boolean[], bigint[], text[], boolean);

-- The one alignment function takes a period and a zone now (defaults: the
-- UTC hour, so window_start_of(ts) still means what it meant).
DROP FUNCTION IF EXISTS window_end_of(timestamptz);
DROP FUNCTION IF EXISTS window_start_of(timestamptz);

-- Reservations whose estimate is settled to the actual (design.md §12): what
-- was taken, from which windows, and by which key, until it is settled or
-- its time to settle (`settle_within`) is past; pruned an hour after that.
CREATE TABLE reservation (
    id            bigint PRIMARY KEY,
    quota         text NOT NULL REFERENCES quota (name) ON DELETE CASCADE,
    flow          text NOT NULL,
    estimated     bigint NOT NULL CHECK (estimated >= 1),
    periods       text[] NOT NULL,
    window_starts timestamptz[] NOT NULL,
    window_ends   timestamptz[] NOT NULL,
    -- The API key that reserved (NULL: no keys, or the admin token).
    key_id        bigint,
    reserved_at   timestamptz NOT NULL DEFAULT arbiter_now(),
    settled_at    timestamptz,
    spent         bigint CHECK (spent >= 0)
);

CREATE INDEX reservation_reserved_at_idx ON reservation (reserved_at);

-- Slots spent past an estimate, tallied when the reservation is settled.
ALTER TABLE decision_tally ADD COLUMN overspent bigint NOT NULL DEFAULT 0;
