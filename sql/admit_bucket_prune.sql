-- Callers' buckets that have been full again for more than $1 seconds
-- (database clock), a batch of $2 at a time: a full bucket reads exactly like
-- a missing one (a caller seen first starts full), so nothing changes for it.
-- No index on full_at (so bucket updates stay HOT, migrations/):
-- this reads the table once a minute, and takes any batch, not the oldest.
DELETE FROM admit_bucket
WHERE key IN (
    SELECT key FROM admit_bucket
    WHERE full_at < arbiter_now() - make_interval(secs => $1::float8)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
