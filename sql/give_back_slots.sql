-- Give back $4 slots that a take took from quota $1's windows (periods $2,
-- starts $3) but that no item could use. Rows locked in key order, as every
-- statement that writes windows locks them; only ever decrements, and never
-- below what the same caller added.
WITH locked AS (
    SELECT w.quota, w.period, w.window_start
    FROM quota_window w
    JOIN unnest($2::text[], $3::timestamptz[]) AS g (period, window_start)
      ON w.quota = $1::text AND w.period = g.period AND w.window_start = g.window_start
    ORDER BY w.quota, w.period
    FOR UPDATE OF w
)
UPDATE quota_window w
SET count = w.count - $4::bigint
FROM locked l
WHERE w.quota = l.quota AND w.period = l.period AND w.window_start = l.window_start
  AND $4::bigint > 0 AND w.count >= $4::bigint
