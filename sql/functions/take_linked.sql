-- Budget takes of calls that spend several quotas at once (docs/design.md
-- §12), all or nothing per call across every window of every quota it
-- spends. A leg is one window of one quota a call spends: leg i is of call
-- p_call[i] (from 1, the calls in the order they are to be decided, each
-- call's legs together), quota p_quota[i], its window of period p_period[i]
-- (zone p_zone[i]), `p_amount[i]` slots against `p_ceiling[i]`, the count
-- the call's flow may reach in it.
--
-- Calls are decided one after the other, first fit: a call is granted when
-- every leg's window, counted with the grants decided before it, has room
-- for its amount; a call that does not fit is passed over and a later,
-- smaller one may still fit. p_regardless (observe mode): every call is
-- spent whatever the counts, and each still learns whether it would have
-- fit.
--
-- One statement, like take_windows(): it locks every window row of the
-- group in key order (quota, period), decides every call on the locked
-- counts and writes each window once. A window row missing (the first take
-- of a window) is created, in key order, and the rows are locked again. A
-- window whose every leg has a ceiling below 1 needs no row: nothing can be
-- taken from it (design.md §3.3).
--
-- One row per leg, in the order given: the call's grant, whether it fit,
-- the window's bounds and its count before the call (the grants decided
-- before it included).
CREATE OR REPLACE FUNCTION take_linked(
    p_call integer[], p_quota text[], p_period text[], p_zone text[],
    p_amount bigint[], p_ceiling bigint[], p_regardless boolean
) RETURNS TABLE (
    o_db_now timestamptz, o_call integer, o_granted boolean, o_fits boolean,
    o_window_start timestamptz, o_window_end timestamptz, o_count_before bigint
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := arbiter_now();
    v_legs integer := coalesce(cardinality(p_call), 0);
    -- Per leg: its window's number among the group's distinct windows.
    v_leg_window integer[];
    v_starts timestamptz[];
    v_ends timestamptz[];
    -- Per distinct window, in key order.
    v_quotas text[];
    v_periods text[];
    v_window_starts timestamptz[];
    v_needs_row boolean[];
    v_counts bigint[];
    v_found bigint[];
    v_before bigint[] := '{}';
    v_granted boolean[] := '{}';
    v_fits boolean[] := '{}';
    v_first integer;
    v_last integer;
    v_fit boolean;
BEGIN
    SELECT array_agg(l.ws ORDER BY l.n), array_agg(l.we ORDER BY l.n)
    INTO v_starts, v_ends
    FROM (SELECT x.n, window_start_of(v_now, x.period, x.zone) AS ws,
                 window_end_of(v_now, x.period, x.zone) AS we
          FROM unnest(p_period, p_zone) WITH ORDINALITY AS x (period, zone, n)) l;
    SELECT array_agg(d.quota ORDER BY d.quota, d.period), array_agg(d.period ORDER BY d.quota, d.period),
           array_agg(d.ws ORDER BY d.quota, d.period), array_agg(d.needs_row ORDER BY d.quota, d.period)
    INTO v_quotas, v_periods, v_window_starts, v_needs_row
    FROM (SELECT x.quota, x.period, v_starts[x.n] AS ws,
                 bool_or(p_regardless OR x.ceiling >= 1) AS needs_row
          FROM unnest(p_quota, p_period, p_ceiling) WITH ORDINALITY AS x (quota, period, ceiling, n)
          GROUP BY x.quota, x.period, v_starts[x.n]) d;
    SELECT array_agg(d.wi ORDER BY x.n)
    INTO v_leg_window
    FROM unnest(p_quota, p_period) WITH ORDINALITY AS x (quota, period, n)
    JOIN unnest(v_quotas, v_periods, v_window_starts) WITH ORDINALITY AS d (quota, period, ws, wi)
      ON d.quota = x.quota AND d.period = x.period AND d.ws = v_starts[x.n];

    FOR attempt IN 1..2 LOOP
        -- Each window's count as locked (FOR UPDATE returns the row's latest
        -- version); NULL where there is no row.
        SELECT array_agg(l.count ORDER BY d.wi)
        INTO v_found
        FROM unnest(v_quotas, v_periods, v_window_starts) WITH ORDINALITY AS d (quota, period, ws, wi)
        LEFT JOIN LATERAL (
            SELECT w.count FROM quota_window w
            WHERE w.quota = d.quota AND w.period = d.period AND w.window_start = d.ws
            FOR UPDATE
        ) l ON true;
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM unnest(v_found, v_needs_row) AS f (count, needs_row)
            WHERE f.needs_row AND f.count IS NULL);
        IF attempt = 2 THEN
            RETURN;
        END IF;
        INSERT INTO quota_window AS w (quota, period, window_start, count)
        SELECT d.quota, d.period, d.ws, 0
        FROM unnest(v_quotas, v_periods, v_window_starts, v_needs_row) AS d (quota, period, ws, needs_row)
        WHERE d.needs_row
        ORDER BY d.quota, d.period
        ON CONFLICT DO NOTHING;
    END LOOP;

    v_counts := array(SELECT coalesce(f, 0) FROM unnest(v_found) AS f);
    v_first := 1;
    WHILE v_first <= v_legs LOOP
        v_last := v_first;
        WHILE v_last < v_legs AND p_call[v_last + 1] = p_call[v_first] LOOP
            v_last := v_last + 1;
        END LOOP;
        v_fit := true;
        FOR i IN v_first..v_last LOOP
            v_before[i] := v_counts[v_leg_window[i]];
            IF v_counts[v_leg_window[i]] + p_amount[i] > p_ceiling[i] THEN
                v_fit := false;
            END IF;
        END LOOP;
        FOR i IN v_first..v_last LOOP
            v_fits[i] := v_fit;
            v_granted[i] := v_fit OR p_regardless;
            IF v_fit OR p_regardless THEN
                v_counts[v_leg_window[i]] := v_counts[v_leg_window[i]] + p_amount[i];
            END IF;
        END LOOP;
        v_first := v_last + 1;
    END LOOP;

    -- The rows are this statement's, locked above.
    UPDATE quota_window w
    SET count = d.count
    FROM unnest(v_quotas, v_periods, v_window_starts, v_counts, v_found)
         AS d (quota, period, ws, count, found)
    WHERE d.found IS NOT NULL AND d.count <> d.found
      AND w.quota = d.quota AND w.period = d.period AND w.window_start = d.ws;

    RETURN QUERY
    SELECT v_now, p_call[i], v_granted[i], v_fits[i], v_starts[i], v_ends[i], v_before[i]
    FROM generate_series(1, v_legs) AS i;
END
$$;
