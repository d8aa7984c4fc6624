-- The stored settings of route class $1, locked while a merge patch is applied.
SELECT r.burst, r.rate, r.capacity, r.window_seconds, r.tenant_share, r.capacity_error_budget
FROM route_class r
WHERE r.name = $1
FOR UPDATE
