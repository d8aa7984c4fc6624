-- Reserve $2 budget slots of quota $1 (ceiling $3) AND $2 cadence tokens, both
-- or neither, in one statement. Cadence: sustained rate $5 tokens/s, bucket
-- size $6, scaled by the adaptive factor when $7 (recovered lazily from elapsed
-- database time). $4 = true (observe): spend the slots regardless; tokens are
-- taken as far as they go. The bucket row is locked before the window row, in
-- every reservation of a quota, so concurrent reservations cannot deadlock.
WITH clock AS (
    SELECT arbiter_now()                  AS now,
           window_start_of(arbiter_now()) AS window_start,
           window_end_of(arbiter_now())   AS window_end
), bucket AS (
    SELECT b.tokens, b.refilled_at,
           CASE WHEN $7::boolean THEN recovered_factor(b.factor, b.factor_at) ELSE 1.0 END AS factor
    FROM quota_bucket b
    WHERE b.quota = $1::text
    FOR UPDATE
), available AS (
    SELECT e.rate, e.burst, e.factor,
           least(e.burst, e.tokens + e.rate * greatest(0, extract(epoch FROM c.now - e.refilled_at))) AS tokens
    FROM (SELECT greatest(0.01, $5::float8 * factor) AS rate, greatest(1.0, $6::float8 * factor) AS burst,
                 factor, tokens, refilled_at
          FROM bucket) e, clock c
), reserved AS (
    INSERT INTO quota_window AS w (quota, window_start, count)
    SELECT $1::text, c.window_start, $2::bigint
    FROM clock c, available a
    WHERE $4::boolean OR ($2::bigint <= $3::bigint AND a.tokens >= $2::bigint)
    ON CONFLICT (quota, window_start) DO UPDATE
        SET count = w.count + EXCLUDED.count
        WHERE $4::boolean OR w.count + EXCLUDED.count <= $3::bigint
    RETURNING w.count
), spent AS (
    UPDATE quota_bucket b
    -- now() is when this transaction started, possibly before a concurrent
    -- reservation that held the lock first: never move the refill clock back,
    -- or the time in between would be refilled twice.
    SET tokens = greatest(0, a.tokens - $2::bigint),
        refilled_at = greatest(b.refilled_at, c.now),
        factor = a.factor, factor_at = greatest(b.factor_at, c.now)
    FROM available a, clock c
    WHERE b.quota = $1::text AND EXISTS (SELECT 1 FROM reserved)
    RETURNING b.tokens
)
SELECT c.window_start                AS "window_start!",
       c.window_end                  AS "window_end!",
       c.now                         AS "db_now!",
       (SELECT count FROM reserved)  AS "count_after?",
       a.tokens >= $2::bigint        AS "tokens_sufficed?",
       -- When the missing tokens will have refilled (sub-second precision).
       c.now + make_interval(secs => greatest(0, ($2::bigint - a.tokens) / a.rate)) AS "tokens_at?",
       -- Explains a refusal only; the decision above never reads it.
       (SELECT w.count FROM quota_window w WHERE w.quota = $1::text AND w.window_start = c.window_start)
                                     AS "window_count?"
FROM clock c
LEFT JOIN available a ON true
