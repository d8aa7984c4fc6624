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

-- Admission decisions, in one statement (sql/admit.sql calls it: one round
-- trip): request i is caller p_keys[i] (a bucket key) of tenant p_tenants[i],
-- all of route class p_route_class, decided in array order (arrival). A lone
-- admission is a group of one; a replica gathers the admissions that arrive
-- while one statement runs into the next group, so a hot route class costs
-- one statement per group, not per request (design.md §11). The limits come
-- from the caller (the catalog's route class, the tenant's allowance computed
-- once in Rust); this function is the atomic part, per request:
--   1. the caller's bucket (created full), refilled to now: fewer than one
--      token refuses ('caller');
--   2. the tenant's count of the window: at its allowance, refuses
--      ('tenant_share');
--   3. the class's count of the window: at capacity, refuses ('capacity');
--   4. otherwise a token and a slot of each count are spent together.
-- All or nothing per request: a refusal spends nothing. Rows are locked in
-- one global order whatever the group (buckets in key order, then tenant rows
-- in name order, then the class's row), so two statements never wait on each
-- other in a cycle; each row is read once it is locked (plpgsql: each
-- statement sees what committed before it, which one SQL statement of CTEs,
-- reading every row as of its start, could not) and written once, at the end.
-- The database clock only: arbiter_now().
CREATE FUNCTION admit_callers(
    p_keys bytea[], p_tenants text[], p_route_class text,
    p_burst double precision, p_rate double precision,
    p_capacity bigint, p_tenant_allowance bigint, p_window_seconds integer
) RETURNS TABLE (
    refused_by text, tokens double precision, db_now timestamptz,
    window_start timestamptz, window_end timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := arbiter_now();
    v_window   timestamptz := admit_window_of(v_now, p_window_seconds);
    v_end      timestamptz := v_window + make_interval(secs => p_window_seconds);
    v_keys     bytea[];
    v_tokens   double precision[];
    v_at       timestamptz[];
    v_spent    boolean[];
    v_tenants  text[];
    v_counts   bigint[];
    v_class    bigint;
    v_admitted bigint := 0;
    v_refused  text[] := '{}';
    v_left     double precision[] := '{}';
    b integer;
    t integer;
BEGIN
    INSERT INTO admit_bucket (key, tokens, refilled_at, full_at)
    SELECT k, p_burst, v_now, v_now FROM (SELECT DISTINCT k FROM unnest(p_keys) k) d ORDER BY k
    ON CONFLICT (key) DO NOTHING;
    SELECT array_agg(l.key ORDER BY l.key),
           array_agg(least(p_burst, l.tokens + p_rate * greatest(0, extract(epoch FROM v_now - l.refilled_at))) ORDER BY l.key),
           array_agg(greatest(l.refilled_at, v_now) ORDER BY l.key)
    INTO v_keys, v_tokens, v_at
    FROM (SELECT a.key, a.tokens, a.refilled_at FROM admit_bucket a
          WHERE a.key = ANY (p_keys) ORDER BY a.key FOR UPDATE) l;
    v_spent := array_fill(false, ARRAY[cardinality(v_keys)]);

    INSERT INTO admit_tenant_window (route_class, tenant, window_start)
    SELECT p_route_class, n, v_window FROM (SELECT DISTINCT n FROM unnest(p_tenants) n) d ORDER BY n
    ON CONFLICT DO NOTHING;
    SELECT array_agg(l.tenant ORDER BY l.tenant), array_agg(l.admitted ORDER BY l.tenant)
    INTO v_tenants, v_counts
    FROM (SELECT w.tenant, w.admitted FROM admit_tenant_window w
          WHERE w.route_class = p_route_class AND w.window_start = v_window
            AND w.tenant = ANY (p_tenants)
          ORDER BY w.tenant FOR UPDATE) l;

    INSERT INTO admit_window (route_class, window_start) VALUES (p_route_class, v_window)
    ON CONFLICT DO NOTHING;
    SELECT w.admitted INTO v_class FROM admit_window w
    WHERE w.route_class = p_route_class AND w.window_start = v_window FOR UPDATE;

    FOR i IN 1 .. cardinality(p_keys) LOOP
        b := array_position(v_keys, p_keys[i]);
        t := array_position(v_tenants, p_tenants[i]);
        IF v_tokens[b] < 1 THEN
            v_refused := v_refused || 'caller'::text;
        ELSIF v_counts[t] >= p_tenant_allowance THEN
            v_refused := v_refused || 'tenant_share'::text;
        ELSIF v_class + v_admitted >= p_capacity THEN
            v_refused := v_refused || 'capacity'::text;
        ELSE
            v_tokens[b] := v_tokens[b] - 1;
            v_spent[b] := true;
            v_counts[t] := v_counts[t] + 1;
            v_admitted := v_admitted + 1;
            v_refused := v_refused || NULL::text;
        END IF;
        v_left := v_left || v_tokens[b];
    END LOOP;

    IF v_admitted > 0 THEN
        UPDATE admit_bucket a
        SET tokens = s.tokens, refilled_at = s.at,
            full_at = s.at + make_interval(secs => (p_burst - s.tokens) / p_rate)
        FROM unnest(v_keys, v_tokens, v_at, v_spent) AS s (key, tokens, at, spent)
        WHERE a.key = s.key AND s.spent;
        UPDATE admit_tenant_window w SET admitted = s.admitted
        FROM unnest(v_tenants, v_counts) AS s (tenant, admitted)
        WHERE w.route_class = p_route_class AND w.window_start = v_window
          AND w.tenant = s.tenant AND w.admitted <> s.admitted;
        UPDATE admit_window w SET admitted = v_class + v_admitted
        WHERE w.route_class = p_route_class AND w.window_start = v_window;
    END IF;
    RETURN QUERY SELECT r.refused_by, r.tokens, v_now, v_window, v_end
                 FROM unnest(v_refused, v_left) WITH ORDINALITY AS r (refused_by, tokens, n)
                 ORDER BY r.n;
END
$$;
