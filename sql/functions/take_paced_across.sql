-- Paced takes across quotas (sql/take_paced_across.sql calls this): the
-- statement below (and, for the first take of a window, the row it needs
-- and the statement again), in a function for two settings of its own.
-- plan_cache_mode = force_generic_plan: planning the last statement takes longer
-- than running it (6-9 ms against under 3 ms for 50 quotas), and a custom
-- plan for the group's own arrays looks cheaper than the generic one, so the
-- plan cache would plan it anew on every call (the claim's statements run
-- under the same setting, sql/claim_plan_settings.sql).
-- enable_seqscan = off: the generic plan estimates the quotas of a group (an
-- unnest of a parameter) at ten and would rather read the whole bucket and
-- window tables than probe their keys ten times (admit_callers() has the
-- same setting for the same reason).
--
-- Takes for groups of asks on paced quotas (a cadence, in-flight places or
-- both), one group per quota, in one call (docs/design.md §8). Quota i of $1
-- asks $8[$2[i]:$3[i]] (each ask's slots, in rationing order) for the flows
-- $9[$2[i]:$3[i]]; $4[i]: every ask needs an in-flight place; cadence rate
-- $5[i] tokens/s and burst $6[i] (NULL: no cadence), both scaled by the
-- adaptive factor when $7[i]; buckets and factors are brought up to now
-- lazily, from elapsed database time. Window j is of quota
-- p_window_quota[j] (an index into $1), with its period, zone and the
-- highest ceiling among the group's asks in it (as take_windows()).
--
-- Locks every window row first, in key order (quota, period), as every
-- statement that writes windows does, then every bucket row in quota order,
-- then up to one free place per ask of each quota (SKIP LOCKED: it never
-- waits for a place; an expired lease is free); two such calls, or one and
-- a budget-only take (take_windows()), wait for each other in that one
-- order and never deadlock. Nothing is decided on a count or a bucket that
-- is not locked (FOR UPDATE reads each row as it is). A window row missing
-- is created and the statement runs again; it writes nothing until every
-- window it needs has a row.
-- Each quota's take is t = least(k, floor(tokens), what the fullest window
-- has left, what the places taken can carry), or 0 when t cannot carry even
-- its smallest ask; t slots are spent in every window of the quota;
-- t tokens are spent and a lease (an unguessable id, valid for twice its
-- flow's average hold time, 5-60 s, 30 s before any history) is made on each
-- place that an ask fitting in t may use, labelled with the flows of the
-- first asks. The caller shares each t out (rationing) and gives back what
-- nobody uses (give_back_paced.sql).
--
-- p_regardless (observe mode): every slot is spent regardless, tokens as far as
-- they go, no place is leased; "tokens" says how far they went.
-- One row per quota, `quota_index` its position in $1 (from 1); lease asks
-- count from 1 within the quota's own asks.
--
-- Lean per quota (measured on one connection, the decision alone, before windows stacked,
-- 2026-12-01, this project's CI machine kind: 40 paced quotas of one ask each
-- took about 1.3 ms, against 2.2 ms for the first version of this function;
-- one hot cadence quota with 40 asks, a tenth less). What it does not do for
-- every quota:
-- - spread the asks into rows and group them again to add them up (each
--   quota's sum and smallest come from its own slice of the asks; the rows of
--   asks are made only for quotas that lease places);
-- - pass the buckets, their tokens, the places and the bounds through four
--   stages joined on the quota's position (the bucket stage computes the
--   tokens there now, one stage computes what the take may be);
-- - read the quota's earliest lease expiry for quotas without places.
-- And a lease finds its place by the place's key (the place's quota comes with
-- the place), where the plan could instead scan every free place of the quota
-- for each lease.
CREATE OR REPLACE FUNCTION take_paced_across(
    p_quotas text[], p_lo integer[], p_hi integer[],
    p_need_places boolean[], p_rates double precision[], p_bursts double precision[],
    p_adaptive boolean[], p_slots bigint[], p_flows text[],
    p_window_quota integer[], p_periods text[], p_zones text[], p_ceilings bigint[],
    p_regardless boolean
) RETURNS TABLE (
    o_quota_index bigint, o_db_now timestamptz, o_taken bigint,
    o_window_starts timestamptz[], o_window_ends timestamptz[], o_counts_before bigint[],
    o_tokens_bound boolean, o_places_bound boolean, o_tokens double precision,
    o_rate double precision, o_lease_ids bigint[], o_lease_valid_until timestamptz[],
    o_lease_asks bigint[], o_first_lease_expiry timestamptz, o_typical_hold double precision
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := arbiter_now();
BEGIN
    FOR attempt IN 1..2 LOOP
    RETURN QUERY
    WITH asked AS (
        SELECT x.qi, x.n, x.ceiling, p_quotas[x.qi] AS quota, x.period,
               window_start_of(v_now, x.period, x.zone) AS window_start,
               window_end_of(v_now, x.period, x.zone) AS window_end
        FROM unnest(p_window_quota, p_periods, p_zones, p_ceilings)
             WITH ORDINALITY AS x (qi, period, zone, ceiling, n)
    ), locked AS (
        -- The window rows first, in key order, as every statement that
        -- writes windows locks them; FOR UPDATE reads each as it is.
        SELECT a.n, w.count
        FROM asked a
        JOIN quota_window w ON w.quota = a.quota AND w.period = a.period
                           AND w.window_start = a.window_start
        ORDER BY w.quota, w.period
        FOR UPDATE OF w
    ), complete AS (
        -- A window whose ceiling is below 1 needs no row (take_windows()).
        SELECT NOT EXISTS (SELECT 1 FROM asked a
                           WHERE a.ceiling >= 1
                             AND NOT EXISTS (SELECT 1 FROM locked l WHERE l.n = a.n)) AS ok
    ), win AS (
        SELECT a.*, coalesce(l.count, 0) AS count
        FROM asked a LEFT JOIN locked l ON l.n = a.n
    ), per_quota AS (
        -- Each quota's windows at once (grouped, not looked up per quota).
        SELECT win.qi, min(win.ceiling - win.count) AS room,
               array_agg(win.window_start ORDER BY win.n) AS starts,
               array_agg(win.window_end ORDER BY win.n) AS ends,
               array_agg(win.count ORDER BY win.n) AS counts
        FROM win
        GROUP BY win.qi
    ), quotas AS (
        -- Each quota with what its asks add up to, the smallest of them, and
        -- what its fullest window has left (NULL: no window).
        SELECT q.qi, q.quota, q.lo, q.hi, q.need_places AND NOT p_regardless AS need_places,
               q.rate, q.burst, q.adaptive, s.total, s.smallest, r.room,
               coalesce(r.starts, '{}') AS starts, coalesce(r.ends, '{}') AS ends,
               coalesce(r.counts, '{}') AS counts
        FROM unnest(p_quotas, p_lo, p_hi, p_need_places, p_rates, p_bursts, p_adaptive)
             WITH ORDINALITY AS q (quota, lo, hi, need_places, rate, burst, adaptive, qi)
        LEFT JOIN per_quota r ON r.qi = q.qi,
        LATERAL (SELECT coalesce(sum(x), 0)::bigint AS total, coalesce(min(x), 0) AS smallest
                 FROM unnest(p_slots[q.lo:q.hi]) AS x) AS s
    ), bucket AS (
        -- Each cadence's bucket, locked, with the tokens there now.
        SELECT q.qi, q.quota, f.factor, f.rate,
               least(greatest(1.0, q.burst * f.factor),
                     b.tokens + f.rate * greatest(0, extract(epoch FROM v_now - b.refilled_at))) AS tokens
        FROM quotas q
        JOIN quota_bucket b ON b.quota = q.quota,
        -- The refill rate: adapted down to 0.01/s at the slowest, never above
        -- the configured rate (the client's rule, client/src/adapt.rs).
        LATERAL (SELECT e.factor, least(q.rate, greatest(0.01, q.rate * e.factor)) AS rate
                 FROM (SELECT CASE WHEN q.adaptive THEN recovered_factor(b.factor, b.factor_at)
                                   ELSE 1.0 END AS factor) e) AS f
        WHERE q.rate IS NOT NULL
          -- Evaluated before the first bucket is locked: the windows come first.
          AND (SELECT ok FROM complete)
        ORDER BY b.quota
        FOR UPDATE OF b
    ), free AS (
        -- Never leased, or expired (quota_place_free_from is the index).
        SELECT q.qi, q.quota, f.place
        FROM quotas q,
        LATERAL (
            SELECT s.place
            FROM quota_place s
            WHERE s.quota = q.quota AND q.need_places
              AND coalesce(s.valid_until, '-infinity') <= v_now
              -- Evaluated before the first place is locked: the buckets come first.
              AND (SELECT count(*) FROM bucket) >= 0
            ORDER BY coalesce(s.valid_until, '-infinity')
            LIMIT q.hi - q.lo + 1
            FOR UPDATE OF s SKIP LOCKED
        ) AS f
    ), want AS (
        -- What each quota's take may be: tokens (a cadence whose bucket is gone
        -- grants nothing until the catalog says so), the room of its fullest
        -- window and what the free places carry (with a place per ask, p
        -- places carry at most the p largest asks).
        SELECT q.qi, q.quota, q.smallest, t.tokens, t.carried,
               CASE WHEN NOT (SELECT ok FROM complete) THEN 0
                    WHEN p_regardless THEN q.total
                    WHEN least(q.total, t.tokens, t.carried, q.room) < greatest(q.smallest, 1) THEN 0
                    ELSE least(q.total, t.tokens, t.carried, q.room) END AS slots
        FROM quotas q
        LEFT JOIN bucket k ON k.qi = q.qi,
        LATERAL (
            SELECT CASE WHEN q.rate IS NULL THEN q.total
                        ELSE coalesce(floor(k.tokens)::bigint, 0) END AS tokens,
                   CASE WHEN q.need_places
                        THEN (SELECT coalesce(sum(l.x), 0)::bigint
                              FROM (SELECT x FROM unnest(p_slots[q.lo:q.hi]) AS x
                                    ORDER BY x DESC
                                    LIMIT (SELECT count(*) FROM free f WHERE f.qi = q.qi)) l)
                        ELSE q.total END AS carried
            -- Computed once per quota: without the fence the planner copies the
            -- subquery into each of the places `slots` reads it.
            OFFSET 0
        ) AS t
    ), reserved AS (
        UPDATE quota_window w
        SET count = win.count + h.slots
        FROM win, want h
        WHERE h.qi = win.qi AND h.slots >= 1
          AND w.quota = win.quota AND w.period = win.period AND w.window_start = win.window_start
    ), spent AS (
        UPDATE quota_bucket b
        -- now() is when this transaction started, possibly before a concurrent
        -- reservation that held the lock first: never move the refill clock back,
        -- or the time in between would be refilled twice.
        SET tokens = greatest(0, k.tokens - h.slots),
            refilled_at = greatest(b.refilled_at, v_now),
            factor = k.factor, factor_at = greatest(b.factor_at, v_now)
        FROM bucket k
        JOIN want h ON h.qi = k.qi
        WHERE b.quota = k.quota AND h.slots >= 1
        RETURNING b.tokens
    ), asks AS (
        SELECT q.qi, (n - q.lo + 1)::bigint AS ord, p_slots[n] AS slots, p_flows[n] AS flow
        FROM quotas q, generate_series(q.lo, q.hi) AS n
        WHERE q.need_places
    ), fitting AS (
        -- How many asks t can carry at most: the smallest ones first.
        SELECT s.qi, count(*) AS asks
        FROM (SELECT a.qi, sum(a.slots) OVER (PARTITION BY a.qi ORDER BY a.slots, a.ord) AS running
              FROM asks a) s
        JOIN want h ON h.qi = s.qi
        WHERE s.running <= h.slots
        GROUP BY s.qi
    ), holders AS (
        -- The place's quota comes with the place, so that the lease below finds
        -- each place by its key.
        SELECT f.qi, f.quota, f.place, a.flow, a.ord,
               -- (greatest/least skip NULLs, hence the explicit CASE.)
               CASE WHEN d.avg_seconds IS NULL THEN 30
                    ELSE least(60, greatest(5, 2 * d.avg_seconds)) END AS seconds
        FROM (SELECT qi, quota, place, row_number() OVER (PARTITION BY qi ORDER BY place) AS n FROM free) f
        JOIN asks a ON a.qi = f.qi AND a.ord = f.n
        JOIN fitting t ON t.qi = f.qi
        LEFT JOIN flow_lease_duration d ON d.flow = a.flow
        WHERE f.n <= t.asks
    ), leased AS (
        UPDATE quota_place s
        SET lease_id = new_lease_id(), flow = h.flow, taken_at = v_now,
            valid_until = v_now + make_interval(secs => h.seconds)
        FROM holders h
        WHERE s.quota = h.quota AND s.place = h.place
        RETURNING h.qi, s.lease_id, s.valid_until, h.ord
    ), leases AS (
        SELECT l.qi, array_agg(l.lease_id ORDER BY l.ord) AS ids,
               array_agg(l.valid_until ORDER BY l.ord) AS valid_until,
               array_agg(l.ord ORDER BY l.ord) AS asks, min(l.valid_until) AS first_expiry
        FROM leased l
        GROUP BY l.qi
    )
    SELECT q.qi,
           v_now,
           h.slots,
           q.starts,
           q.ends,
           q.counts,
           -- Which limit stopped the take short of what was asked: the tokens when
           -- the windows had room for more (a full window outranks missing tokens:
           -- the tokens come back sooner).
           coalesce(q.rate IS NOT NULL AND NOT p_regardless
                    AND coalesce(floor(k.tokens), 0) < least(q.total, q.room),
                    false),
           -- Or the free places, when they carried less than the windows and the
           -- tokens allowed (a place frees when its lease ends).
           h.carried < least(q.total, h.tokens, q.room),
           k.tokens,
           k.rate,
           coalesce(l.ids, '{}'),
           coalesce(l.valid_until, '{}'),
           coalesce(l.asks, '{}'),
           -- When the first lease expires (the earliest a place frees by itself):
           -- only an enforced quota with places can be refused for want of one.
           CASE WHEN q.need_places
                THEN least((SELECT coalesce(s.valid_until, '-infinity') FROM quota_place s
                            WHERE s.quota = q.quota AND coalesce(s.valid_until, '-infinity') > v_now
                            ORDER BY coalesce(s.valid_until, '-infinity') LIMIT 1),
                           l.first_expiry) END,
           -- How long a place is typically held (the average hold time of
           -- the quota's flows, seconds): when one is expected to free,
           -- sooner than the first lease's expiry, which is twice as long at
           -- least. Read only when the places bound the take.
           CASE WHEN h.carried < least(q.total, h.tokens, q.room)
                THEN (SELECT avg(d.avg_seconds) FROM flow f
                      JOIN flow_lease_duration d ON d.flow = f.name
                      WHERE f.quota = q.quota) END
    FROM quotas q
    JOIN want h ON h.qi = q.qi
    LEFT JOIN bucket k ON k.qi = q.qi
    LEFT JOIN leases l ON l.qi = q.qi
    WHERE (SELECT ok FROM complete)
    ORDER BY q.qi;
    IF FOUND OR attempt = 2 THEN
        RETURN;
    END IF;
    -- The first take of a window: its row, then the statement again.
    INSERT INTO quota_window AS w (quota, period, window_start, count)
    SELECT p_quotas[x.qi], x.period, window_start_of(v_now, x.period, x.zone), 0
    FROM unnest(p_window_quota, p_periods, p_zones, p_ceilings) AS x (qi, period, zone, ceiling)
    WHERE x.ceiling >= 1
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
    END LOOP;
END
$$;
