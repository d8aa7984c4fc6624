-- Paced quotas (a cadence, in-flight places or both) decided together across
-- quotas: one call takes, for each quota of a group in quota order, what
-- sql/take_paced.sql took for one quota alone (that statement is this
-- function's loop body now: the docs/design.md §8 take, unchanged). Rows are
-- locked quota after quota, each quota's bucket, then its places (SKIP
-- LOCKED), then its window, so two calls that share quotas lock them in the
-- same order and never deadlock; a budget-only take across quotas locks
-- windows in the same quota order.
--
-- Quota i of p_quotas asks p_slots[p_lo[i]:p_hi[i]] (each ask's slots, in
-- rationing order) for the flows p_flows[p_lo[i]:p_hi[i]], against the
-- highest ceiling p_ceilings[i] among them; p_need_places[i]: every ask needs
-- an in-flight place; cadence p_rates[i] tokens/s and burst p_bursts[i]
-- (NULL: no cadence), scaled by the adaptive factor when p_adaptive[i].
-- p_regardless (observe mode): every slot is spent, tokens as far as they
-- go, no place is leased. One row per quota, o_index its position in p_quotas
-- (from 1); lease asks count from 1 within the quota's own asks.
CREATE FUNCTION take_paced_across(
    p_quotas text[], p_lo integer[], p_hi integer[], p_ceilings bigint[],
    p_need_places boolean[], p_rates double precision[], p_bursts double precision[],
    p_adaptive boolean[], p_slots bigint[], p_flows text[], p_regardless boolean
) RETURNS TABLE (
    o_index integer, o_window_start timestamptz, o_window_end timestamptz,
    o_db_now timestamptz, o_count_before bigint, o_count_after bigint, o_taken bigint,
    o_tokens_bound boolean, o_places_bound boolean, o_tokens double precision,
    o_rate double precision, o_lease_ids bigint[], o_lease_valid_until timestamptz[],
    o_lease_asks bigint[], o_first_lease_expiry timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_index       integer;
    v_quota       text;
    v_slots       bigint[];
    v_flows       text[];
    v_ceiling     bigint;
    v_need_places boolean;
    v_rate        double precision;
    v_burst       double precision;
    v_adaptive    boolean;
BEGIN
    FOR v_index, v_quota, v_slots, v_flows, v_ceiling, v_need_places, v_rate, v_burst, v_adaptive IN
        SELECT q.ord::integer, q.quota, p_slots[q.lo:q.hi], p_flows[q.lo:q.hi], q.ceiling,
               q.need_places, q.rate, q.burst, q.adaptive
        FROM unnest(p_quotas, p_lo, p_hi, p_ceilings, p_need_places, p_rates, p_bursts, p_adaptive)
             WITH ORDINALITY AS q (quota, lo, hi, ceiling, need_places, rate, burst, adaptive, ord)
        ORDER BY q.quota
    LOOP
        RETURN QUERY
        WITH clock AS (
            SELECT arbiter_now()                  AS now,
                   window_start_of(arbiter_now()) AS window_start,
                   window_end_of(arbiter_now())   AS window_end
        ), asks AS (
            SELECT a.slots, (v_flows)[a.ord] AS flow, a.ord
            FROM unnest(v_slots) WITH ORDINALITY AS a (slots, ord)
        ), asked AS (
            SELECT coalesce(sum(slots), 0)::bigint AS total, coalesce(min(slots), 0) AS smallest FROM asks
        ), bucket AS (
            SELECT b.tokens, b.refilled_at,
                   CASE WHEN v_adaptive THEN recovered_factor(b.factor, b.factor_at) ELSE 1.0 END AS factor
            FROM quota_bucket b
            WHERE b.quota = v_quota AND v_rate IS NOT NULL
            FOR UPDATE
        ), available AS (
            SELECT e.rate, e.burst, e.factor,
                   least(e.burst, e.tokens + e.rate * greatest(0, extract(epoch FROM c.now - e.refilled_at))) AS tokens
            FROM (SELECT greatest(0.01, v_rate * factor) AS rate, greatest(1.0, v_burst * factor) AS burst,
                         factor, tokens, refilled_at
                  FROM bucket) e, clock c
        ), free AS (
            -- Never leased, or expired (quota_place_free_from is the index).
            SELECT s.place
            FROM quota_place s
            WHERE s.quota = v_quota AND v_need_places AND NOT p_regardless
              AND coalesce(s.valid_until, '-infinity') <= (SELECT now FROM clock)
              -- Evaluated before the first place is locked: the bucket row comes first.
              AND (SELECT count(*) FROM available) >= 0
            ORDER BY coalesce(s.valid_until, '-infinity')
            LIMIT cardinality(v_slots)
            FOR UPDATE OF s SKIP LOCKED
        ), places AS (
            SELECT count(*) AS free FROM free
        ), bounds AS (
            SELECT k.total,
                   -- A cadence whose bucket is gone (the quota just lost it) grants nothing
                   -- until the catalog says so.
                   CASE WHEN v_rate IS NULL THEN k.total
                        ELSE coalesce((SELECT floor(tokens)::bigint FROM available), 0) END AS tokens,
                   -- With a place per ask, q places carry at most the q largest asks.
                   CASE WHEN v_need_places
                        THEN (SELECT coalesce(sum(l.slots), 0)::bigint
                              FROM (SELECT a.slots FROM asks a ORDER BY a.slots DESC LIMIT p.free) l)
                        ELSE k.total END AS carried,
                   k.smallest
            FROM asked k, places p
        ), want AS (
            SELECT CASE WHEN p_regardless THEN b.total
                        WHEN least(b.total, b.tokens, b.carried, v_ceiling) < b.smallest THEN 0
                        ELSE least(b.total, b.tokens, b.carried, v_ceiling) END AS slots,
                   b.smallest
            FROM bounds b
        ), reserved AS (
            INSERT INTO quota_window AS w (quota, window_start, count, last_take)
            SELECT v_quota, c.window_start, h.slots, h.slots
            FROM clock c, want h
            WHERE h.slots >= 1
            ON CONFLICT (quota, window_start) DO UPDATE
                SET count     = w.count + CASE WHEN p_regardless THEN EXCLUDED.count
                                               ELSE least(EXCLUDED.count, v_ceiling - w.count) END,
                    last_take = CASE WHEN p_regardless THEN EXCLUDED.count
                                     ELSE least(EXCLUDED.count, v_ceiling - w.count) END
                -- Room for the smallest ask at least, else nothing is taken.
                WHERE p_regardless OR w.count + (SELECT smallest FROM want) <= v_ceiling
            RETURNING w.count, w.last_take
        ), spent AS (
            UPDATE quota_bucket b
            -- now() is when this transaction started, possibly before a concurrent
            -- reservation that held the lock first: never move the refill clock back,
            -- or the time in between would be refilled twice.
            SET tokens = greatest(0, a.tokens - r.last_take),
                refilled_at = greatest(b.refilled_at, c.now),
                factor = a.factor, factor_at = greatest(b.factor_at, c.now)
            FROM available a, clock c, reserved r
            WHERE b.quota = v_quota
            RETURNING b.tokens
        ), fitting AS (
            -- How many asks t can carry at most: the smallest ones first.
            SELECT count(*) AS asks
            FROM (SELECT sum(a.slots) OVER (ORDER BY a.slots, a.ord) AS running FROM asks a) s, reserved r
            WHERE s.running <= r.last_take
        ), holders AS (
            SELECT f.place, a.flow, a.ord,
                   -- (greatest/least skip NULLs, hence the explicit CASE.)
                   CASE WHEN d.avg_seconds IS NULL THEN 30
                        ELSE least(60, greatest(5, 2 * d.avg_seconds)) END AS seconds
            FROM (SELECT place, row_number() OVER (ORDER BY place) AS n FROM free) f
            JOIN asks a ON a.ord = f.n
            LEFT JOIN flow_lease_duration d ON d.flow = a.flow
            WHERE f.n <= (SELECT asks FROM fitting)
        ), leased AS (
            UPDATE quota_place s
            SET lease_id = new_lease_id(), flow = h.flow, taken_at = c.now,
                valid_until = c.now + make_interval(secs => h.seconds)
            FROM holders h, clock c
            WHERE s.quota = v_quota AND s.place = h.place
            RETURNING s.lease_id, s.valid_until, h.ord
        ), before AS (
            -- The count the take started from; when nothing was taken, the window as
            -- this statement saw it, to explain the refusal only.
            SELECT coalesce((SELECT count - last_take FROM reserved),
                            (SELECT w.count FROM quota_window w, clock c
                             WHERE w.quota = v_quota AND w.window_start = c.window_start),
                            0) AS count
        )
        SELECT v_index,
               c.window_start,
               c.window_end,
               c.now,
               o.count,
               (SELECT count FROM reserved),
               coalesce((SELECT last_take FROM reserved), 0),
               -- Which limit stopped the take short of what was asked: the tokens when
               -- the window had room for more (a full window outranks missing tokens:
               -- the tokens come back sooner).
               coalesce(v_rate IS NOT NULL AND NOT p_regardless
                        AND coalesce(floor(a.tokens), 0) < least((SELECT total FROM asked), v_ceiling - o.count),
                        false),
               -- Or the free places, when they carried less than the window and the
               -- tokens allowed (a place frees when its lease ends).
               (SELECT b.carried < least(b.total, b.tokens, v_ceiling - o.count)
                FROM bounds b),
               a.tokens,
               a.rate,
               (SELECT coalesce(array_agg(lease_id ORDER BY ord), '{}') FROM leased),
               (SELECT coalesce(array_agg(valid_until ORDER BY ord), '{}') FROM leased),
               (SELECT coalesce(array_agg(ord ORDER BY ord), '{}') FROM leased),
               -- When the first lease expires: the earliest a place frees by itself.
               least((SELECT coalesce(s.valid_until, '-infinity') FROM quota_place s
                      WHERE s.quota = v_quota AND coalesce(s.valid_until, '-infinity') > c.now
                      ORDER BY coalesce(s.valid_until, '-infinity') LIMIT 1),
                     (SELECT min(valid_until) FROM leased))
        FROM clock c
        CROSS JOIN before o
        LEFT JOIN available a ON true;
    END LOOP;
END
$$;
