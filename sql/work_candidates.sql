-- Lock the most urgent claimable items of the flows $1, in rationing order:
-- deadline ASC NULLS LAST, priority, first come first served. Claimable:
-- pending and past its retry delay (`not_before`), or claimed with a lease
-- that ran out. Only the worker's flows $2
-- (NULL: all), and only items outside the bypass horizon ($3 seconds). Rows
-- another claim holds are skipped, and nothing is changed here.
-- Each flow walks its own index in order and stops at $4 items: the claim
-- holds its quota's window row meanwhile, so neither other flows' backlog nor
-- a sort of this one's may stand in the way. (coalesce() rather than
-- "deadline IS NULL OR …", which would turn the ordered walk into a sort.)
SELECT c.id, c.flow, c.deadline, c.priority, c.ref AS reference
FROM unnest($1::text[]) AS f (name),
LATERAL (
    SELECT id, flow, deadline, priority, ref
    FROM work_item
    WHERE state <> 'done' AND (state = 'pending' OR lease_until < arbiter_now())
      AND coalesce(not_before <= arbiter_now(), true)
      AND flow = f.name
      AND ($2::text[] IS NULL OR flow = ANY($2::text[]))
      AND coalesce(deadline > arbiter_now() + make_interval(secs => $3::float8), true)
    ORDER BY deadline ASC NULLS LAST, priority, id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
) AS c
ORDER BY c.deadline ASC NULLS LAST, c.priority, c.id
LIMIT $4
