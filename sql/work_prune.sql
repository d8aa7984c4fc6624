-- Deletes up to $2 work items done more than $1 seconds ago (database clock),
-- oldest first. Replicas prune concurrently: rows another one is deleting are
-- skipped, not waited for.
DELETE FROM work_item
WHERE id IN (
    SELECT id FROM work_item
    WHERE state = 'done' AND done_at < arbiter_now() - make_interval(secs => $1::float8)
    ORDER BY done_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
