-- Every key, never its secret (only the hash is stored anyway).
SELECT id, name, role, tenant, created_at, revoked_at
FROM api_key
ORDER BY id
