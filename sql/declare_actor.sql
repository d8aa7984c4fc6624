-- Names who is changing the catalog for the rest of this transaction; the
-- audit trigger records it (raw SQL without it is recorded as its role).
SELECT set_config('quota_arbiter.actor', $1, true) AS "actor!"
