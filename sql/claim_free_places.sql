-- Locks up to $2 free in-flight places of quota $1 for a claim (a place whose
-- lease expired is free). The claim leases them (claim_lease_places.sql) once
-- it knows which items get one; the rest are unlocked at commit, untouched.
-- Taken before the window row, in the same order as a single reservation.
SELECT s.place
FROM quota_place s
WHERE s.quota = $1::text AND (s.valid_until IS NULL OR s.valid_until <= arbiter_now())
ORDER BY s.place
LIMIT $2
FOR UPDATE SKIP LOCKED
