-- Flows (all, or the one named $1) with their settings.
SELECT name, quota, array_prepend(quota, further_quotas) AS "quotas!", mode, priority, enforce_percent, fallback, created_at, updated_at
FROM flow
WHERE $1::text IS NULL OR name = $1
ORDER BY name
