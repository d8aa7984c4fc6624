-- The revision just applied, in the transaction that applied it.
INSERT INTO sql_objects (revision) VALUES ($1)
ON CONFLICT (singleton) DO UPDATE SET revision = excluded.revision, applied_at = arbiter_now()
