-- Give back to paced quota $1 what a group take (take_paced_across.sql) took and no
-- grant uses, in one statement: leases $8 freed, leases $9 handed to the flows
-- $10 (one each; validity recomputed for the new holder from when the lease
-- was taken), $4 slots back to the windows the take took them from
-- (periods $2, starts $3; only ever a decrement, never below what the same
-- caller added), and $5 tokens back to the bucket, never above its burst
-- ($6: the configured burst, scaled by the adaptive factor now when $7;
-- NULL: no cadence).
--
-- The places come first, then the windows in key order, then the bucket:
-- the takes lock windows, then buckets, then places without waiting for
-- any (SKIP LOCKED), so whoever waits for a place holds neither a window
-- nor a bucket another statement waits for.
WITH handed AS (
    UPDATE quota_place s
    SET flow = h.flow,
        -- (greatest/least skip NULLs, hence the explicit CASE.)
        valid_until = s.taken_at + make_interval(secs =>
            CASE WHEN d.avg_seconds IS NULL THEN 30
                 ELSE least(60, greatest(5, 2 * d.avg_seconds)) END)
    FROM unnest($9::bigint[], $10::text[]) AS h (lease_id, flow)
    LEFT JOIN flow_lease_duration d ON d.flow = h.flow
    WHERE s.quota = $1::text AND s.lease_id = h.lease_id
    RETURNING s.place
), freed AS (
    UPDATE quota_place s
    SET lease_id = NULL, flow = NULL, taken_at = NULL, valid_until = NULL
    WHERE s.quota = $1::text AND s.lease_id = ANY($8::bigint[])
    RETURNING s.place
), locked AS (
    SELECT w.quota, w.period, w.window_start
    FROM quota_window w
    JOIN unnest($2::text[], $3::timestamptz[]) AS g (period, window_start)
      ON w.quota = $1::text AND w.period = g.period AND w.window_start = g.window_start
    WHERE $4::bigint > 0
      -- Evaluated before the windows are locked: the places come first.
      AND (SELECT count(*) FROM handed) + (SELECT count(*) FROM freed) >= 0
    ORDER BY w.quota, w.period
    FOR UPDATE OF w
), returned AS (
    UPDATE quota_window w
    SET count = w.count - $4::bigint
    FROM locked l
    WHERE w.quota = l.quota AND w.period = l.period AND w.window_start = l.window_start
      AND w.count >= $4::bigint
    RETURNING 1
)
UPDATE quota_bucket b
SET tokens = least(greatest(1.0, $6::float8 * CASE WHEN $7::boolean
                                                   THEN recovered_factor(b.factor, b.factor_at)
                                                   ELSE 1.0 END),
                   b.tokens + $5::bigint)
WHERE b.quota = $1::text AND $5::bigint > 0 AND $6::float8 IS NOT NULL
  -- Evaluated before the bucket is locked: the windows come first.
  AND (SELECT count(*) FROM locked) + (SELECT count(*) FROM returned) >= 0
