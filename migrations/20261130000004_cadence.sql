-- Budget and cadence: a token bucket beside the hourly budget, adaptive
-- shrinking on upstream errors, concurrency slots with leases, and headroom
-- that keeps the top of a window for the flows that matter most.

ALTER TABLE quota
    -- Cadence: sustained tokens per second and bucket size; both or neither.
    -- Bounded so that refill arithmetic can never overflow.
    ADD COLUMN rate  double precision CHECK (rate > 0 AND rate <= 1e6),
    ADD COLUMN burst double precision CHECK (burst >= 1 AND burst <= 1e9),
    -- Shrink rate and burst on upstream 429/timeout/5xx, recover when quiet.
    ADD COLUMN adaptive boolean NOT NULL DEFAULT true,
    ADD COLUMN max_in_flight integer CHECK (max_in_flight BETWEEN 1 AND 10000),
    -- Headroom: priority-2 and priority-3 flows may use only this share of the
    -- ceiling (percent), leaving the rest to priority 1. NULL: no cap.
    ADD COLUMN priority2_share smallint CHECK (priority2_share BETWEEN 0 AND 100),
    ADD COLUMN priority3_share smallint CHECK (priority3_share BETWEEN 0 AND 100),
    ADD CONSTRAINT quota_cadence_pair CHECK ((rate IS NULL) = (burst IS NULL));

-- O(1) cadence state per quota: tokens at refilled_at, and the adaptive factor
-- (0 < factor <= 1) applied to rate and burst as of factor_at.
CREATE TABLE quota_bucket (
    quota       text PRIMARY KEY REFERENCES quota (name) ON DELETE CASCADE,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    factor      double precision NOT NULL DEFAULT 1 CHECK (factor > 0 AND factor <= 1),
    factor_at   timestamptz NOT NULL
);

-- One row per concurrency slot of a quota; a slot is free when it holds no
-- lease or its lease has expired (a crashed worker cannot keep it).
CREATE TABLE quota_slot (
    quota       text NOT NULL REFERENCES quota (name) ON DELETE CASCADE,
    slot        integer NOT NULL,
    lease_id    bigint UNIQUE,
    flow        text,
    taken_at    timestamptz,
    valid_until timestamptz,
    PRIMARY KEY (quota, slot)
);

CREATE SEQUENCE lease_id_seq;

-- Exponential moving average of how long a flow's emissions hold a lease.
CREATE TABLE flow_lease_duration (
    flow        text PRIMARY KEY,
    avg_seconds double precision NOT NULL,
    samples     bigint NOT NULL DEFAULT 1
);

-- Keep the bucket and the slots in step with the quota's settings.
CREATE FUNCTION sync_quota_limits() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.rate IS NULL THEN
        DELETE FROM quota_bucket WHERE quota = NEW.name;
    ELSE
        -- A new bucket starts full; an existing one keeps its tokens (capped by
        -- the new burst when it is read), so a settings change grants no burst.
        INSERT INTO quota_bucket (quota, tokens, refilled_at, factor_at)
        VALUES (NEW.name, NEW.burst, arbiter_now(), arbiter_now())
        ON CONFLICT (quota) DO NOTHING;
    END IF;
    DELETE FROM quota_slot WHERE quota = NEW.name AND slot > coalesce(NEW.max_in_flight, 0);
    INSERT INTO quota_slot (quota, slot)
    SELECT NEW.name, s FROM generate_series(1, coalesce(NEW.max_in_flight, 0)) s
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER quota_limits AFTER INSERT OR UPDATE OF rate, burst, max_in_flight ON quota
    FOR EACH ROW EXECUTE FUNCTION sync_quota_limits();

-- The adaptive factor now: recovered passively by 0.5% per second of database
-- time since it was last set, never above 1.
CREATE FUNCTION recovered_factor(factor double precision, factor_at timestamptz)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT least(1.0, factor * power(1.005, greatest(0, extract(epoch FROM arbiter_now() - factor_at))))
$$;

-- Cadence per quota: configured and effective (adaptive) rate and burst, and
-- the tokens in the bucket right now.
CREATE VIEW quota_cadence AS
SELECT q.name AS quota, q.rate, q.burst, q.adaptive,
       f.factor,
       greatest(0.01, q.rate * f.factor) AS effective_rate,
       greatest(1.0, q.burst * f.factor) AS effective_burst,
       least(greatest(1.0, q.burst * f.factor),
             b.tokens + greatest(0.01, q.rate * f.factor)
                        * greatest(0, extract(epoch FROM arbiter_now() - b.refilled_at))) AS tokens_now,
       q.max_in_flight,
       (SELECT count(*) FROM quota_slot s
        WHERE s.quota = q.name AND s.valid_until > arbiter_now()) AS leases_held
FROM quota q
JOIN quota_bucket b ON b.quota = q.name
CROSS JOIN LATERAL (
    SELECT CASE WHEN q.adaptive THEN recovered_factor(b.factor, b.factor_at) ELSE 1.0 END AS factor
) f;
