-- Takes a free in-flight place of quota $1 for flow $2: a lease valid for
-- twice the flow's average hold time, clamped to [5 s, 60 s], 30 s before any
-- history. Expired leases count as free. SKIP LOCKED: places being taken by
-- others are passed over; a place taken meanwhile is re-checked after locking.
WITH clock AS (
    SELECT arbiter_now() AS now
), validity AS (
    -- (greatest/least skip NULLs, hence the explicit CASE.)
    SELECT CASE WHEN d.avg_seconds IS NULL THEN 30
                ELSE least(60, greatest(5, 2 * d.avg_seconds)) END AS seconds
    FROM (SELECT 1) one
    LEFT JOIN flow_lease_duration d ON d.flow = $2::text
), free AS (
    SELECT s.place
    FROM quota_place s, clock c
    WHERE s.quota = $1::text AND (s.valid_until IS NULL OR s.valid_until <= c.now)
    ORDER BY s.place
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE quota_place s
SET lease_id = nextval('lease_id_seq'), flow = $2::text, taken_at = c.now,
    valid_until = c.now + make_interval(secs => v.seconds)
FROM free f, clock c, validity v
WHERE s.quota = $1::text AND s.place = f.place
RETURNING s.lease_id AS "lease_id!", s.valid_until AS "valid_until!"
