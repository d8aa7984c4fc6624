SELECT name, quota, mode, priority, enforce_percent, created_at, updated_at
FROM flow
ORDER BY name
