-- Give back to paced quota $1 what a group take (take_paced_across.sql) took and no
-- grant uses, in one statement: leases $7 freed, leases $8 handed to the flows
-- $9 (one each; validity recomputed for the new holder from when the lease
-- was taken), $4 tokens back to the bucket, never above its burst ($5: the
-- configured burst, scaled by the adaptive factor now when $6; NULL: no
-- cadence), and $3 slots back to window $2 (only ever a decrement, never below
-- what the same caller added).
--
-- The places come first, then the bucket, then the window. A take or a claim
-- that locked one of these places as free in an older snapshot and skipped it
-- keeps its lock (FOR UPDATE SKIP LOCKED does) while it goes on to the bucket
-- or the window: whoever waits for a place must hold neither.
WITH handed AS (
    UPDATE quota_place s
    SET flow = h.flow,
        -- (greatest/least skip NULLs, hence the explicit CASE.)
        valid_until = s.taken_at + make_interval(secs =>
            CASE WHEN d.avg_seconds IS NULL THEN 30
                 ELSE least(60, greatest(5, 2 * d.avg_seconds)) END)
    FROM unnest($8::bigint[], $9::text[]) AS h (lease_id, flow)
    LEFT JOIN flow_lease_duration d ON d.flow = h.flow
    WHERE s.quota = $1::text AND s.lease_id = h.lease_id
    RETURNING s.place
), freed AS (
    UPDATE quota_place s
    SET lease_id = NULL, flow = NULL, taken_at = NULL, valid_until = NULL
    WHERE s.quota = $1::text AND s.lease_id = ANY($7::bigint[])
    RETURNING s.place
), refilled AS (
    UPDATE quota_bucket b
    SET tokens = least(greatest(1.0, $5::float8 * CASE WHEN $6::boolean
                                                       THEN recovered_factor(b.factor, b.factor_at)
                                                       ELSE 1.0 END),
                       b.tokens + $4::bigint)
    WHERE b.quota = $1::text AND $4::bigint > 0 AND $5::float8 IS NOT NULL
      -- Evaluated before the bucket is locked: the places come first.
      AND (SELECT count(*) FROM handed) + (SELECT count(*) FROM freed) >= 0
    RETURNING b.tokens
)
UPDATE quota_window
SET count = count - $3::bigint
WHERE quota = $1::text AND window_start = $2 AND $3::bigint > 0 AND count >= $3::bigint
  -- Evaluated before the window row is locked: the bucket comes first.
  AND (SELECT count(*) FROM refilled) >= 0
