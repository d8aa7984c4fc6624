-- Lock the most urgent claimable items of the flows $1, in rationing order:
-- deadline ASC NULLS LAST, priority, first come first served. Claimable:
-- pending, or claimed with a lease that ran out. Only the worker's flows $2
-- (NULL: all), and only items outside the bypass horizon ($3 seconds). Rows
-- another claim holds are skipped, and nothing is changed here. (Each lane has
-- its own statement so that one cached plan walks the queue index in order.)
SELECT id, flow, deadline, priority, ref AS reference
FROM work_item
WHERE state <> 'done' AND (state = 'pending' OR lease_until < arbiter_now())
  AND flow = ANY($1::text[])
  AND ($2::text[] IS NULL OR flow = ANY($2::text[]))
  AND (deadline IS NULL OR deadline > arbiter_now() + make_interval(secs => $3::float8))
ORDER BY deadline ASC NULLS LAST, priority, id
LIMIT $4
FOR UPDATE SKIP LOCKED
