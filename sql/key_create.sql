-- A new key: only its hash is stored.
INSERT INTO api_key (name, role, tenant, hash)
VALUES ($1, $2, $3, $4)
RETURNING id, created_at
