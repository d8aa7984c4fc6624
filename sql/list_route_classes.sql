-- Route classes (all, or the one named $1), by name.
SELECT r.name, r.burst, r.rate, r.capacity, r.window_seconds, r.tenant_share,
       r.capacity_error_budget, r.created_at, r.updated_at
FROM route_class r
WHERE $1::text IS NULL OR r.name = $1
ORDER BY r.name
