-- Leases the places $2 of quota $1 (locked by claim_free_places.sql) to the
-- flows $3, one each: valid for twice the flow's average hold time, clamped to
-- [5 s, 60 s], 30 s before any history, as for a single reservation.
WITH asked AS (
    SELECT t.place, t.flow,
           -- (greatest/least skip NULLs, hence the explicit CASE.)
           CASE WHEN d.avg_seconds IS NULL THEN 30
                ELSE least(60, greatest(5, 2 * d.avg_seconds)) END AS seconds
    FROM unnest($2::integer[], $3::text[]) AS t (place, flow)
    LEFT JOIN flow_lease_duration d ON d.flow = t.flow
)
UPDATE quota_place s
SET lease_id = new_lease_id(), flow = a.flow, taken_at = arbiter_now(),
    valid_until = arbiter_now() + make_interval(secs => a.seconds)
FROM asked a
WHERE s.quota = $1::text AND s.place = a.place
RETURNING s.place, s.lease_id AS "lease_id!", s.valid_until AS "valid_until!"
