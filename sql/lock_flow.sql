-- A flow's stored settings, locked until the patch that read them commits.
SELECT quota, further_quotas, mode, priority, enforce_percent, fallback
FROM flow
WHERE name = $1
FOR UPDATE
