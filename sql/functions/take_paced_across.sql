-- Paced takes across quotas (sql/take_paced_across.sql calls this): the
-- statement below, in a function only for two settings of its own.
-- plan_cache_mode = force_generic_plan: planning this statement takes longer
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
-- both), one group per quota, in one statement (docs/design.md §8). Quota i
-- of $1 asks $9[$2[i]:$3[i]] (each ask's slots, in rationing order) for the
-- flows $10[$2[i]:$3[i]], against the highest ceiling $4[i] among them;
-- $5[i]: every ask needs an in-flight place; cadence rate $6[i] tokens/s and
-- burst $7[i] (NULL: no cadence), both scaled by the adaptive factor when
-- $8[i]; buckets and factors are brought up to now lazily, from elapsed
-- database time.
--
-- Locks every bucket row first, in quota order (before any window row, as
-- every statement of a quota does), then up to one free place per ask of each
-- quota (SKIP LOCKED: it never waits for a place; an expired lease is free),
-- then the window rows in quota order in the conditional upsert; two such
-- statements, or one and a budget-only take across quotas, wait for each
-- other in that one order and never deadlock.
-- Each quota's take is t = least(k, floor(tokens), ceiling - count, what the
-- places taken can carry), or 0 when t cannot carry even its smallest ask;
-- t tokens are spent and a lease (an unguessable id, valid for twice its
-- flow's average hold time, 5-60 s, 30 s before any history) is made on each
-- place that an ask fitting in t may use, labelled with the flows of the
-- first asks. The caller shares each t out (rationing) and gives back what
-- nobody uses (give_back_paced.sql).
--
-- $11 = true (observe mode): every slot is spent regardless, tokens as far as
-- they go, no place is leased; "tokens" says how far they went.
-- One row per quota, `quota_index` its position in $1 (from 1); lease asks
-- count from 1 within the quota's own asks.
--
-- Lean per quota (measured on one connection, the statement alone,
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
-- - find a conflicting window row's smallest ask by scanning the group (an
--   array built once, looked up by position);
-- - match each row taken to its quota by name in a nested loop (the upsert
--   answers the quota's position);
-- - read the window row to explain a take that took something (its count
--   before is the count after less the take), nor the quota's earliest lease
--   expiry for quotas without places.
-- And a lease finds its place by the place's key (the place's quota comes with
-- the place), where the plan could instead scan every free place of the quota
-- for each lease.
CREATE OR REPLACE FUNCTION take_paced_across(
    p_quotas text[], p_lo integer[], p_hi integer[], p_ceilings bigint[],
    p_need_places boolean[], p_rates double precision[], p_bursts double precision[],
    p_adaptive boolean[], p_slots bigint[], p_flows text[], p_regardless boolean
) RETURNS TABLE (
    o_quota_index bigint, o_window_start timestamptz, o_window_end timestamptz,
    o_db_now timestamptz, o_count_before bigint, o_count_after bigint, o_taken bigint,
    o_tokens_bound boolean, o_places_bound boolean, o_tokens double precision,
    o_rate double precision, o_lease_ids bigint[], o_lease_valid_until timestamptz[],
    o_lease_asks bigint[], o_first_lease_expiry timestamptz
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS (
        SELECT arbiter_now()                  AS now,
               window_start_of(arbiter_now()) AS window_start,
               window_end_of(arbiter_now())   AS window_end
    ), quotas AS (
        -- Each quota with what its asks add up to and the smallest of them.
        SELECT q.qi, q.quota, q.lo, q.hi, q.ceiling, q.need_places AND NOT $11::boolean AS need_places,
               q.rate, q.burst, q.adaptive, s.total, s.smallest
        FROM unnest($1::text[], $2::integer[], $3::integer[], $4::bigint[], $5::boolean[],
                    $6::float8[], $7::float8[], $8::boolean[])
             WITH ORDINALITY AS q (quota, lo, hi, ceiling, need_places, rate, burst, adaptive, qi),
        LATERAL (SELECT coalesce(sum(x), 0)::bigint AS total, coalesce(min(x), 0) AS smallest
                 FROM unnest(($9::bigint[])[q.lo:q.hi]) AS x) AS s
    ), bucket AS (
        -- Each cadence's bucket, locked, with the tokens there now.
        SELECT q.qi, q.quota, f.factor, f.rate,
               least(greatest(1.0, q.burst * f.factor),
                     b.tokens + f.rate * greatest(0, extract(epoch FROM c.now - b.refilled_at))) AS tokens
        FROM quotas q
        JOIN quota_bucket b ON b.quota = q.quota
        CROSS JOIN clock c,
        -- The refill rate: adapted down to 0.01/s at the slowest, never above
        -- the configured rate (the client's rule, client/src/adapt.rs).
        LATERAL (SELECT e.factor, least(q.rate, greatest(0.01, q.rate * e.factor)) AS rate
                 FROM (SELECT CASE WHEN q.adaptive THEN recovered_factor(b.factor, b.factor_at)
                                   ELSE 1.0 END AS factor) e) AS f
        WHERE q.rate IS NOT NULL
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
              AND coalesce(s.valid_until, '-infinity') <= (SELECT now FROM clock)
              -- Evaluated before the first place is locked: the buckets come first.
              AND (SELECT count(*) FROM bucket) >= 0
            ORDER BY coalesce(s.valid_until, '-infinity')
            LIMIT q.hi - q.lo + 1
            FOR UPDATE OF s SKIP LOCKED
        ) AS f
    ), want AS (
        -- What each quota's take may be: tokens (a cadence whose bucket is gone
        -- grants nothing until the catalog says so) and what the free places
        -- carry (with a place per ask, p places carry at most the p largest asks).
        SELECT q.qi, q.quota, q.smallest, t.tokens, t.carried,
               CASE WHEN $11::boolean THEN q.total
                    WHEN least(q.total, t.tokens, t.carried, q.ceiling) < q.smallest THEN 0
                    ELSE least(q.total, t.tokens, t.carried, q.ceiling) END AS slots
        FROM quotas q
        LEFT JOIN bucket k ON k.qi = q.qi,
        LATERAL (
            SELECT CASE WHEN q.rate IS NULL THEN q.total
                        ELSE coalesce(floor(k.tokens)::bigint, 0) END AS tokens,
                   CASE WHEN q.need_places
                        THEN (SELECT coalesce(sum(l.x), 0)::bigint
                              FROM (SELECT x FROM unnest(($9::bigint[])[q.lo:q.hi]) AS x
                                    ORDER BY x DESC
                                    LIMIT (SELECT count(*) FROM free f WHERE f.qi = q.qi)) l)
                        ELSE q.total END AS carried
            -- Computed once per quota: without the fence the planner copies the
            -- subquery into each of the three places `slots` reads it.
            OFFSET 0
        ) AS t
    ), reserved AS (
        INSERT INTO quota_window AS w (quota, window_start, count, last_take)
        SELECT h.quota, c.window_start, h.slots, h.slots
        FROM want h, clock c
        WHERE h.slots >= 1
        ORDER BY h.quota
        ON CONFLICT (quota, window_start) DO UPDATE
            SET count     = w.count + CASE WHEN $11::boolean THEN EXCLUDED.count
                                           ELSE least(EXCLUDED.count,
                                                      ($4::bigint[])[array_position($1::text[], w.quota)] - w.count) END,
                last_take = CASE WHEN $11::boolean THEN EXCLUDED.count
                                 ELSE least(EXCLUDED.count,
                                            ($4::bigint[])[array_position($1::text[], w.quota)] - w.count) END
            -- Room for the smallest ask at least, else nothing is taken.
            WHERE $11::boolean
               OR w.count + (SELECT array_agg(h.smallest ORDER BY h.qi) FROM want h)[array_position($1::text[], w.quota)]
                  <= ($4::bigint[])[array_position($1::text[], w.quota)]
        RETURNING array_position($1::text[], w.quota)::bigint AS qi, w.count, w.last_take
    ), spent AS (
        UPDATE quota_bucket b
        -- now() is when this transaction started, possibly before a concurrent
        -- reservation that held the lock first: never move the refill clock back,
        -- or the time in between would be refilled twice.
        SET tokens = greatest(0, k.tokens - r.last_take),
            refilled_at = greatest(b.refilled_at, c.now),
            factor = k.factor, factor_at = greatest(b.factor_at, c.now)
        FROM bucket k
        JOIN reserved r ON r.qi = k.qi
        CROSS JOIN clock c
        WHERE b.quota = k.quota
        RETURNING b.tokens
    ), asks AS (
        SELECT q.qi, (n - q.lo + 1)::bigint AS ord, ($9::bigint[])[n] AS slots, ($10::text[])[n] AS flow
        FROM quotas q, generate_series(q.lo, q.hi) AS n
        WHERE q.need_places
    ), fitting AS (
        -- How many asks t can carry at most: the smallest ones first.
        SELECT s.qi, count(*) AS asks
        FROM (SELECT a.qi, sum(a.slots) OVER (PARTITION BY a.qi ORDER BY a.slots, a.ord) AS running
              FROM asks a) s
        JOIN reserved r ON r.qi = s.qi
        WHERE s.running <= r.last_take
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
        SET lease_id = new_lease_id(), flow = h.flow, taken_at = c.now,
            valid_until = c.now + make_interval(secs => h.seconds)
        FROM holders h
        CROSS JOIN clock c
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
           c.window_start,
           c.window_end,
           c.now,
           o.count,
           r.count,
           coalesce(r.last_take, 0),
           -- Which limit stopped the take short of what was asked: the tokens when
           -- the window had room for more (a full window outranks missing tokens:
           -- the tokens come back sooner).
           coalesce(q.rate IS NOT NULL AND NOT $11::boolean
                    AND coalesce(floor(k.tokens), 0) < least(q.total, q.ceiling - o.count),
                    false),
           -- Or the free places, when they carried less than the window and the
           -- tokens allowed (a place frees when its lease ends).
           h.carried < least(q.total, h.tokens, q.ceiling - o.count),
           k.tokens,
           k.rate,
           coalesce(l.ids, '{}'),
           coalesce(l.valid_until, '{}'),
           coalesce(l.asks, '{}'),
           -- When the first lease expires (the earliest a place frees by itself):
           -- only an enforced quota with places can be refused for want of one.
           CASE WHEN q.need_places
                THEN least((SELECT coalesce(s.valid_until, '-infinity') FROM quota_place s
                            WHERE s.quota = q.quota AND coalesce(s.valid_until, '-infinity') > c.now
                            ORDER BY coalesce(s.valid_until, '-infinity') LIMIT 1),
                           l.first_expiry) END
    FROM quotas q
    CROSS JOIN clock c
    JOIN want h ON h.qi = q.qi
    LEFT JOIN bucket k ON k.qi = q.qi
    LEFT JOIN reserved r ON r.qi = q.qi
    LEFT JOIN leases l ON l.qi = q.qi,
    -- The count each take started from; when nothing was taken, the window as
    -- this statement saw it (read only then), to explain the refusal.
    LATERAL (SELECT coalesce(r.count - r.last_take,
                             (SELECT w.count FROM quota_window w
                              WHERE w.quota = q.quota AND w.window_start = c.window_start),
                             0) AS count) AS o
    ORDER BY q.qi;
END
$$;
