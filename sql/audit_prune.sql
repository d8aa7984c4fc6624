-- Deletes up to $2 catalog audit entries recorded more than $1 seconds ago
-- (database clock), oldest first.
DELETE FROM catalog_audit
WHERE id IN (
    SELECT id FROM catalog_audit
    WHERE changed_at < arbiter_now() - make_interval(secs => $1::float8)
    ORDER BY changed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
