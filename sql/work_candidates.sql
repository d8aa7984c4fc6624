-- Lock the most urgent claimable items of the flows $1, in rationing order:
-- deadline ASC NULLS LAST, priority, first come first served. Claimable:
-- pending and past its retry delay (`not_before`), or claimed with a lease
-- that ran out. Only the worker's flows $2 (NULL: all), and only items
-- outside the bypass horizon ($3 seconds). Rows another claim holds are
-- skipped, and nothing is changed here. $5: only items without a `spend`
-- (a lane of one quota's slots: an item with a `spend` is decided on its
-- own, like a reservation, sql/work_candidates_with_spend.sql), or all
-- (the items of a flow that spends several quotas, each decided on its own).
-- Pending items: each flow walks its own index of pending items in order and
-- stops at $4 (so neither other flows' backlog, nor items claimed before, nor
-- a sort stand in the way). Lapsed leases: read by when they ran out, few,
-- then sorted (the order written as an expression, so that no queue index
-- tempts the planner into walking every claimed item in order instead).
-- The best $4 of both. (coalesce() rather than "deadline IS NULL OR …",
-- which would turn the ordered walk into a sort.)
WITH pending AS (
    SELECT c.id, c.flow, c.deadline, c.priority, c.ref, c.spend
    FROM unnest($1::text[]) AS f (name),
    LATERAL (
        SELECT id, flow, deadline, priority, ref, spend
        FROM work_item
        WHERE state = 'pending'
          AND coalesce(not_before <= arbiter_now(), true)
          AND flow = f.name
          AND (NOT $5::boolean OR spend IS NULL)
          AND ($2::text[] IS NULL OR flow = ANY($2::text[]))
          AND coalesce(deadline > arbiter_now() + make_interval(secs => $3::float8), true)
        ORDER BY deadline ASC NULLS LAST, priority, id
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ) AS c
), lapsed AS (
    SELECT id, flow, deadline, priority, ref, spend
    FROM work_item
    WHERE state = 'claimed' AND lease_until < arbiter_now()
      AND flow = ANY($1::text[])
      AND (NOT $5::boolean OR spend IS NULL)
      AND ($2::text[] IS NULL OR flow = ANY($2::text[]))
      AND coalesce(deadline > arbiter_now() + make_interval(secs => $3::float8), true)
    ORDER BY coalesce(deadline, 'infinity'), priority, id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
SELECT id AS "id!", flow AS "flow!", deadline, priority AS "priority!", ref AS reference, spend
FROM (SELECT * FROM pending UNION ALL SELECT * FROM lapsed) AS claimable
ORDER BY deadline ASC NULLS LAST, priority, id
LIMIT $4
