-- Revokes key $1; a key already revoked keeps its first revocation time.
UPDATE api_key
SET revoked_at = coalesce(revoked_at, arbiter_now())
WHERE id = $1
RETURNING id, revoked_at AS "revoked_at!"
