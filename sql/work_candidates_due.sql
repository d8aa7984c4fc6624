-- Lock the claimable items of the worker's flows $1 (NULL: all) whose deadline
-- is within the bypass horizon ($2 seconds): they are claimed as bypassed,
-- without a reservation. Earliest deadline first; rows another claim holds
-- are skipped.
SELECT id, flow, deadline, priority, ref AS reference
FROM work_item
WHERE state <> 'done' AND (state = 'pending' OR lease_until < arbiter_now())
  AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
  AND deadline <= arbiter_now() + make_interval(secs => $2::float8)
ORDER BY deadline ASC NULLS LAST, priority, id
LIMIT $3
FOR UPDATE SKIP LOCKED
