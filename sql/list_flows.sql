SELECT name, quota, mode, priority, created_at, updated_at
FROM flow
ORDER BY name
