SELECT name, hourly_ceiling, created_at, updated_at
FROM quota
ORDER BY name
