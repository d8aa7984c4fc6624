-- Callers' buckets that have been full again for more than $1 seconds
-- (database clock), a batch of $2 at a time: a full bucket reads exactly like
-- a missing one (a caller seen first starts full), so nothing changes for it.
DELETE FROM admit_bucket
WHERE key IN (
    SELECT key FROM admit_bucket
    WHERE full_at < arbiter_now() - make_interval(secs => $1::float8)
    ORDER BY full_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
