-- Take for a group of asks on a paced quota $1 (a cadence, in-flight places or
-- both), in one statement: $2 the slots of each ask in rationing order, $3
-- their flows, $4 the highest ceiling among them, $5 whether every ask needs an
-- in-flight place. Cadence: rate $6 tokens/s and burst $7 (NULL: no cadence),
-- both scaled by the adaptive factor when $8; the bucket and the factor are
-- brought up to now lazily, from elapsed database time.
--
-- Locks the bucket row first (before the window row, as every statement of a
-- quota does), then up to one free place per ask (SKIP LOCKED: it never waits
-- for a place; an expired lease is free), then the window row in the
-- conditional upsert.
-- The take is t = least(k, floor(tokens), ceiling - count, what the places
-- taken can carry), or 0 when t cannot carry even the smallest ask; t tokens
-- are spent and a lease (an unguessable id, valid for twice its flow's average
-- hold time, 5-60 s, 30 s before any history) is made on each place that an
-- ask fitting in t may use, labelled with the flows of the first asks. The
-- caller shares t out (rationing) and gives back what nobody uses
-- (give_back_paced.sql).
--
-- $9 = true (observe mode): every slot is spent regardless, tokens as far as
-- they go, no place is leased; "tokens" says how far they went.
WITH clock AS (
    SELECT arbiter_now()                  AS now,
           window_start_of(arbiter_now()) AS window_start,
           window_end_of(arbiter_now())   AS window_end
), asks AS (
    SELECT a.slots, ($3::text[])[a.ord] AS flow, a.ord
    FROM unnest($2::bigint[]) WITH ORDINALITY AS a (slots, ord)
), asked AS (
    SELECT coalesce(sum(slots), 0)::bigint AS total, coalesce(min(slots), 0) AS smallest FROM asks
), bucket AS (
    SELECT b.tokens, b.refilled_at,
           CASE WHEN $8::boolean THEN recovered_factor(b.factor, b.factor_at) ELSE 1.0 END AS factor
    FROM quota_bucket b
    WHERE b.quota = $1::text AND $6::float8 IS NOT NULL
    FOR UPDATE
), available AS (
    SELECT e.rate, e.burst, e.factor,
           least(e.burst, e.tokens + e.rate * greatest(0, extract(epoch FROM c.now - e.refilled_at))) AS tokens
    FROM (SELECT greatest(0.01, $6::float8 * factor) AS rate, greatest(1.0, $7::float8 * factor) AS burst,
                 factor, tokens, refilled_at
          FROM bucket) e, clock c
), free AS (
    -- Never leased, or expired (quota_place_free_from is the index).
    SELECT s.place
    FROM quota_place s
    WHERE s.quota = $1::text AND $5::boolean AND NOT $9::boolean
      AND coalesce(s.valid_until, '-infinity') <= (SELECT now FROM clock)
      -- Evaluated before the first place is locked: the bucket row comes first.
      AND (SELECT count(*) FROM available) >= 0
    ORDER BY coalesce(s.valid_until, '-infinity')
    LIMIT cardinality($2::bigint[])
    FOR UPDATE OF s SKIP LOCKED
), places AS (
    SELECT count(*) AS free FROM free
), bounds AS (
    SELECT k.total,
           -- A cadence whose bucket is gone (the quota just lost it) grants nothing
           -- until the catalog says so.
           CASE WHEN $6::float8 IS NULL THEN k.total
                ELSE coalesce((SELECT floor(tokens)::bigint FROM available), 0) END AS tokens,
           -- With a place per ask, q places carry at most the q largest asks.
           CASE WHEN $5::boolean
                THEN (SELECT coalesce(sum(l.slots), 0)::bigint
                      FROM (SELECT a.slots FROM asks a ORDER BY a.slots DESC LIMIT p.free) l)
                ELSE k.total END AS carried,
           k.smallest
    FROM asked k, places p
), want AS (
    SELECT CASE WHEN $9::boolean THEN b.total
                WHEN least(b.total, b.tokens, b.carried, $4::bigint) < b.smallest THEN 0
                ELSE least(b.total, b.tokens, b.carried, $4::bigint) END AS slots,
           b.smallest
    FROM bounds b
), reserved AS (
    INSERT INTO quota_window AS w (quota, window_start, count, last_take)
    SELECT $1::text, c.window_start, h.slots, h.slots
    FROM clock c, want h
    WHERE h.slots >= 1
    ON CONFLICT (quota, window_start) DO UPDATE
        SET count     = w.count + CASE WHEN $9::boolean THEN EXCLUDED.count
                                       ELSE least(EXCLUDED.count, $4::bigint - w.count) END,
            last_take = CASE WHEN $9::boolean THEN EXCLUDED.count
                             ELSE least(EXCLUDED.count, $4::bigint - w.count) END
        -- Room for the smallest ask at least, else nothing is taken.
        WHERE $9::boolean OR w.count + (SELECT smallest FROM want) <= $4::bigint
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
    WHERE b.quota = $1::text
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
    WHERE s.quota = $1::text AND s.place = h.place
    RETURNING s.lease_id, s.valid_until, h.ord
), before AS (
    -- The count the take started from; when nothing was taken, the window as
    -- this statement saw it, to explain the refusal only.
    SELECT coalesce((SELECT count - last_take FROM reserved),
                    (SELECT w.count FROM quota_window w, clock c
                     WHERE w.quota = $1::text AND w.window_start = c.window_start),
                    0) AS count
)
SELECT c.window_start                                   AS "window_start!",
       c.window_end                                     AS "window_end!",
       c.now                                            AS "db_now!",
       o.count                                          AS "count_before!",
       (SELECT count FROM reserved)                     AS "count_after?",
       coalesce((SELECT last_take FROM reserved), 0)    AS "taken!",
       -- Which limit stopped the take short of what was asked: the tokens when
       -- the window had room for more (a full window outranks missing tokens:
       -- the tokens come back sooner).
       coalesce($6::float8 IS NOT NULL AND NOT $9::boolean
                AND coalesce(floor(a.tokens), 0) < least((SELECT total FROM asked), $4::bigint - o.count),
                false)                                  AS "tokens_bound!",
       -- Or the free places, when they carried less than the window and the
       -- tokens allowed (a place frees when its lease ends).
       (SELECT b.carried < least(b.total, b.tokens, $4::bigint - o.count)
        FROM bounds b)                                  AS "places_bound!",
       a.tokens                                         AS "tokens?",
       a.rate                                           AS "rate?",
       (SELECT coalesce(array_agg(lease_id ORDER BY ord), '{}') FROM leased)    AS "lease_ids!",
       (SELECT coalesce(array_agg(valid_until ORDER BY ord), '{}') FROM leased) AS "lease_valid_until!",
       (SELECT coalesce(array_agg(ord ORDER BY ord), '{}') FROM leased)         AS "lease_asks!",
       -- When the first lease expires: the earliest a place frees by itself.
       least((SELECT coalesce(s.valid_until, '-infinity') FROM quota_place s
              WHERE s.quota = $1::text AND coalesce(s.valid_until, '-infinity') > c.now
              ORDER BY coalesce(s.valid_until, '-infinity') LIMIT 1),
             (SELECT min(valid_until) FROM leased))     AS "first_lease_expiry?"
FROM clock c
CROSS JOIN before o
LEFT JOIN available a ON true
