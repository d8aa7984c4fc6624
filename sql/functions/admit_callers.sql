-- Admission decisions, in one statement (sql/admit.sql calls it: one round
-- trip): request i is caller p_keys[i] (a bucket key) of tenant p_tenants[i],
-- all of route class p_route_class, decided in array order (arrival), each
-- all or nothing. A lone admission is a group of one; a replica gathers the
-- admissions that arrive while one statement runs into the next group, so a
-- hot route class costs one statement per group, not per request
-- (docs/design.md §11). The limits come from the caller (the catalog's route
-- class, the tenant's allowance computed once in Rust); this function is the
-- atomic part, per request:
--   1. the caller's bucket (a missing one is full), refilled to now: fewer
--      than one token refuses ('caller');
--   2. the tenant's count of the window: at its allowance, refuses
--      ('tenant_share');
--   3. the class's count of the window: at capacity, refuses ('capacity');
--   4. otherwise a token and a slot of each count are spent together.
-- A refusal writes nothing. The database clock only: arbiter_now().
--
-- Admissions of one route class are serialized by a lock on the class, not by
-- locking the rows they read: a transaction-scoped advisory lock on the class
-- first (key space 1634560372, "amit", then the class name's hash; two classes
-- that share a hash only wait for each other). Each caller's bucket is a row
-- of its class alone (its key hashes the class name), and the tenant and class
-- counts are rows of the class: whoever writes them holds the class's lock, so
-- rows read under it stay as read until commit, and each is read once and
-- written once (an upsert), with no row lock of its own to take first. (Row
-- locks took, per caller, an insert probe, a row lock and an update of its
-- bucket, and the same for each tenant's row.) A lock on the class rather than
-- on its window row also covers a window's end: two statements that see
-- different windows still take turns on the buckets. The other writers stay
-- safe: pruning deletes only buckets full again (a missing bucket reads as a
-- full one; SKIP LOCKED, it never waits for an admission) and counts of
-- windows an hour gone.
--
-- enable_seqscan = off: the function keeps its statements' plans for the life
-- of the connection, planned while the table may still be nearly empty; a
-- plan that reads the whole bucket table for a group's keys would stay with a
-- table of ten thousand rows. It only ever reaches buckets and window rows by
-- key, so it never plans a sequential scan.
CREATE OR REPLACE FUNCTION admit_callers(
    p_keys bytea[], p_tenants text[], p_route_class text,
    p_burst double precision, p_rate double precision,
    p_capacity bigint, p_tenant_allowance bigint, p_window_seconds integer
) RETURNS TABLE (
    refused_by text, tokens double precision, db_now timestamptz,
    window_start timestamptz, window_end timestamptz
)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
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
    v_moved    boolean[];
    v_class    bigint;
    v_admitted bigint := 0;
    v_refused  text[] := '{}';
    v_left     double precision[] := '{}';
    b integer;
    t integer;
BEGIN
    PERFORM pg_advisory_xact_lock(1634560372, hashtext(p_route_class));
    SELECT array_agg(d.k ORDER BY d.k),
           array_agg(coalesce(least(p_burst, a.tokens + p_rate * greatest(0, extract(epoch FROM v_now - a.refilled_at))), p_burst) ORDER BY d.k),
           array_agg(greatest(a.refilled_at, v_now) ORDER BY d.k)
    INTO v_keys, v_tokens, v_at
    FROM (SELECT DISTINCT k FROM unnest(p_keys) k) d LEFT JOIN admit_bucket a ON a.key = d.k;
    v_spent := array_fill(false, ARRAY[cardinality(v_keys)]);

    SELECT array_agg(d.n ORDER BY d.n), array_agg(coalesce(w.admitted, 0) ORDER BY d.n)
    INTO v_tenants, v_counts
    FROM (SELECT DISTINCT n FROM unnest(p_tenants) n) d
    LEFT JOIN admit_tenant_window w
      ON w.route_class = p_route_class AND w.window_start = v_window AND w.tenant = d.n;
    v_moved := array_fill(false, ARRAY[cardinality(v_tenants)]);

    SELECT coalesce(max(w.admitted), 0) INTO v_class FROM admit_window w
    WHERE w.route_class = p_route_class AND w.window_start = v_window;

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
            v_moved[t] := true;
            v_admitted := v_admitted + 1;
            v_refused := v_refused || NULL::text;
        END IF;
        v_left := v_left || v_tokens[b];
    END LOOP;

    IF v_admitted > 0 THEN
        INSERT INTO admit_bucket AS a (key, tokens, refilled_at, full_at)
        SELECT s.key, s.tokens, s.at, s.at + make_interval(secs => (p_burst - s.tokens) / p_rate)
        FROM unnest(v_keys, v_tokens, v_at, v_spent) AS s (key, tokens, at, spent)
        WHERE s.spent
        ON CONFLICT (key) DO UPDATE
        SET tokens = excluded.tokens, refilled_at = excluded.refilled_at, full_at = excluded.full_at;
        INSERT INTO admit_tenant_window AS w (route_class, tenant, window_start, admitted)
        SELECT p_route_class, s.tenant, v_window, s.admitted
        FROM unnest(v_tenants, v_counts, v_moved) AS s (tenant, admitted, moved)
        WHERE s.moved
        ON CONFLICT (route_class, tenant, window_start) DO UPDATE SET admitted = excluded.admitted;
        INSERT INTO admit_window AS w (route_class, window_start, admitted)
        VALUES (p_route_class, v_window, v_class + v_admitted)
        ON CONFLICT (route_class, window_start) DO UPDATE SET admitted = excluded.admitted;
    END IF;
    RETURN QUERY SELECT r.refused_by, r.tokens, v_now, v_window, v_end
                 FROM unnest(v_refused, v_left) WITH ORDINALITY AS r (refused_by, tokens, n)
                 ORDER BY r.n;
END
$$;
