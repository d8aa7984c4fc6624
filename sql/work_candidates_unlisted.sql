-- As work_candidates.sql, for the flows NOT in $1: the ones the arbiter does
-- not throttle. Outside the bypass horizon ($3 seconds), the worker's flows $2
-- (NULL: all), most urgent first, skipping rows another claim holds.
SELECT id, flow, deadline, priority, ref AS reference
FROM work_item
WHERE state <> 'done' AND (state = 'pending' OR lease_until < arbiter_now())
  AND flow <> ALL($1::text[])
  AND ($2::text[] IS NULL OR flow = ANY($2::text[]))
  AND (deadline IS NULL OR deadline > arbiter_now() + make_interval(secs => $3::float8))
ORDER BY deadline ASC NULLS LAST, priority, id
LIMIT $4
FOR UPDATE SKIP LOCKED
