-- Caller-scoped admission (design.md §11): route classes, each caller's
-- token bucket, and the admissions counted per tenant and per route class in
-- windows of the class's `window_seconds`, aligned on the database clock.

-- A route class: the profile a gateway names when it asks whether to admit a
-- request (`public-apis`, `partner-apis`). `burst` and `rate` (per second)
-- size each caller's bucket; `capacity` admissions per window are shared by
-- every caller of the class, and no tenant takes more than `tenant_share` of
-- them in one window. Bounded like a quota's cadence and ceiling.
CREATE TABLE route_class (
    name           text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    burst          double precision NOT NULL CHECK (burst >= 1 AND burst <= 1e9),
    rate           double precision NOT NULL CHECK (rate > 0 AND rate <= 1e6),
    capacity       bigint NOT NULL CHECK (capacity >= 1 AND capacity <= 9007199254740992),
    window_seconds integer NOT NULL CHECK (window_seconds BETWEEN 1 AND 3600
                                           AND 3600 % window_seconds = 0),
    tenant_share   double precision NOT NULL CHECK (tenant_share > 0 AND tenant_share <= 1),
    created_at     timestamptz NOT NULL DEFAULT arbiter_now(),
    updated_at     timestamptz NOT NULL DEFAULT arbiter_now()
);

-- Route classes are catalog entries like quotas and flows: audited, and
-- announced on the channel every replica listens on.
ALTER TABLE catalog_audit DROP CONSTRAINT catalog_audit_entity_check;
ALTER TABLE catalog_audit ADD CONSTRAINT catalog_audit_entity_check
    CHECK (entity IN ('quota', 'flow', 'route_class'));
CREATE TRIGGER route_class_audit AFTER INSERT OR UPDATE OR DELETE ON route_class
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();

-- Each caller's token bucket, keyed by a SHA-256 of who the caller is (tenant
-- and principal, or the anonymous network range) and the route class: the
-- table holds no identifier in clear, and the key is fixed-size whatever the
-- principal. The primary key is the only index the hot path uses, so ten
-- thousand callers cost one B-tree descent each.
-- UNLOGGED: a bucket is short-lived, written on every admission, and worth no
-- WAL. After a crash the table is empty and every caller starts with a full
-- bucket: at most one burst more per caller, once; the capacity and tenant
-- counts below, which protect the provider, are logged.
CREATE UNLOGGED TABLE admit_bucket (
    key         bytea PRIMARY KEY CHECK (length(key) = 32),
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    -- When the bucket is full again if nothing is spent: from then on it
    -- reads exactly like a missing one, so it can be pruned.
    full_at     timestamptz NOT NULL
);
CREATE INDEX admit_bucket_full_at ON admit_bucket (full_at);

-- Admissions of a route class per window, and of each tenant of it. The
-- anonymous callers of a class count together under tenant '' (no tenant
-- identifier is ever made up for them).
CREATE TABLE admit_window (
    route_class  text NOT NULL REFERENCES route_class (name) ON DELETE CASCADE,
    window_start timestamptz NOT NULL,
    admitted     bigint NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    PRIMARY KEY (route_class, window_start)
);
CREATE INDEX admit_window_start ON admit_window (window_start);

CREATE TABLE admit_tenant_window (
    route_class  text NOT NULL REFERENCES route_class (name) ON DELETE CASCADE,
    tenant       text NOT NULL,
    window_start timestamptz NOT NULL,
    admitted     bigint NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    PRIMARY KEY (route_class, tenant, window_start)
);
CREATE INDEX admit_tenant_window_start ON admit_tenant_window (window_start);

-- The start of the window of `seconds` (dividing an hour) that `ts` is in:
-- aligned on the UTC hour, so every replica and every class agree.
CREATE FUNCTION admit_window_of(ts timestamptz, seconds integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT window_start_of(ts)
           + make_interval(secs => floor(extract(epoch FROM ts - window_start_of(ts)) / seconds) * seconds)
$$;

-- One admission decision (sql/admit.sql calls it: one statement, one round
-- trip). The limits come from the caller (the catalog's route class, the
-- tenant's allowance computed once in Rust); this function is the atomic part:
--   1. the caller's bucket (created full), locked, refilled to now: fewer
--      than one token refuses ('caller') and nothing is written;
--   2. the tenant's row of the window, locked: at its allowance, refuses
--      ('tenant_share') and nothing is written;
--   3. the class's row of the window, locked: at capacity, refuses
--      ('capacity') and nothing is written;
--   4. otherwise a token and a slot of each count are spent together.
-- Locks are always taken in that order (bucket, tenant row, class row), so
-- two admissions never wait on each other in a cycle. Each step reads the row
-- it has just locked (a plpgsql statement sees what committed before it),
-- which one SQL statement with CTEs could not: its snapshot is taken once.
-- The database clock only: arbiter_now().
CREATE FUNCTION admit_caller(
    p_key bytea, p_route_class text, p_tenant text,
    p_burst double precision, p_rate double precision,
    p_capacity bigint, p_tenant_allowance bigint, p_window_seconds integer
) RETURNS TABLE (
    refused_by text, tokens double precision, db_now timestamptz,
    window_start timestamptz, window_end timestamptz
)
LANGUAGE plpgsql AS $$
-- The output columns (tokens, window_start) are also column names of the
-- tables: in a statement, a bare name is the table's column.
#variable_conflict use_column
DECLARE
    v_now     timestamptz := arbiter_now();
    v_window  timestamptz := admit_window_of(v_now, p_window_seconds);
    v_end     timestamptz := v_window + make_interval(secs => p_window_seconds);
    v_tokens  double precision;
    v_at      timestamptz;
    v_tenant  bigint;
    v_class   bigint;
BEGIN
    SELECT b.tokens, b.refilled_at INTO v_tokens, v_at
    FROM admit_bucket b WHERE b.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO admit_bucket (key, tokens, refilled_at, full_at)
        VALUES (p_key, p_burst, v_now, v_now) ON CONFLICT (key) DO NOTHING;
        SELECT b.tokens, b.refilled_at INTO v_tokens, v_at
        FROM admit_bucket b WHERE b.key = p_key FOR UPDATE;
    END IF;
    -- A burst lowered since the bucket was filled caps it; time spent
    -- waiting for the lock (v_now is before it) is never refilled twice.
    v_tokens := least(p_burst, v_tokens + p_rate * greatest(0, extract(epoch FROM v_now - v_at)));
    v_at := greatest(v_at, v_now);
    IF v_tokens < 1 THEN
        RETURN QUERY SELECT 'caller'::text, v_tokens, v_now, v_window, v_end;
        RETURN;
    END IF;

    SELECT t.admitted INTO v_tenant FROM admit_tenant_window t
    WHERE t.route_class = p_route_class AND t.tenant = p_tenant AND t.window_start = v_window
    FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO admit_tenant_window (route_class, tenant, window_start)
        VALUES (p_route_class, p_tenant, v_window) ON CONFLICT DO NOTHING;
        SELECT t.admitted INTO v_tenant FROM admit_tenant_window t
        WHERE t.route_class = p_route_class AND t.tenant = p_tenant AND t.window_start = v_window
        FOR UPDATE;
    END IF;
    IF v_tenant >= p_tenant_allowance THEN
        RETURN QUERY SELECT 'tenant_share'::text, v_tokens, v_now, v_window, v_end;
        RETURN;
    END IF;

    SELECT w.admitted INTO v_class FROM admit_window w
    WHERE w.route_class = p_route_class AND w.window_start = v_window
    FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO admit_window (route_class, window_start)
        VALUES (p_route_class, v_window) ON CONFLICT DO NOTHING;
        SELECT w.admitted INTO v_class FROM admit_window w
        WHERE w.route_class = p_route_class AND w.window_start = v_window
        FOR UPDATE;
    END IF;
    IF v_class >= p_capacity THEN
        RETURN QUERY SELECT 'capacity'::text, v_tokens, v_now, v_window, v_end;
        RETURN;
    END IF;

    UPDATE admit_bucket
    SET tokens = v_tokens - 1, refilled_at = v_at,
        full_at = v_at + make_interval(secs => (p_burst - (v_tokens - 1)) / p_rate)
    WHERE key = p_key;
    UPDATE admit_tenant_window SET admitted = admitted + 1
    WHERE route_class = p_route_class AND tenant = p_tenant AND window_start = v_window;
    UPDATE admit_window SET admitted = admitted + 1
    WHERE route_class = p_route_class AND window_start = v_window;
    RETURN QUERY SELECT NULL::text, v_tokens - 1, v_now, v_window, v_end;
END
$$;
