-- The keys a replica accepts: every one not revoked.
SELECT id, role, tenant, hash
FROM api_key
WHERE revoked_at IS NULL
