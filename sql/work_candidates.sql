-- Lock the most urgent claimable items of one lane, in rationing order:
-- deadline ASC NULLS LAST, priority, first come first served. Claimable:
-- pending, or claimed with a lease that ran out. Lane: flows in $1 when $2,
-- flows not in $1 otherwise; only the worker's flows $3 (NULL: all); inside
-- the bypass horizon ($4 seconds) when $5, outside it otherwise. Rows another
-- claim holds are skipped, and nothing is changed here.
SELECT id, flow, deadline, priority, ref AS reference
FROM work_item
WHERE (state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now()))
  AND (flow = ANY($1::text[])) = $2::boolean
  AND ($3::text[] IS NULL OR flow = ANY($3::text[]))
  AND (deadline IS NOT NULL AND deadline <= arbiter_now() + make_interval(secs => $4::float8))
      = $5::boolean
ORDER BY deadline ASC NULLS LAST, priority, id
LIMIT $6
FOR UPDATE SKIP LOCKED
