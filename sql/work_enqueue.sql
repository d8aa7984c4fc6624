-- Enqueue a work item; a ref seen before returns the existing item instead
-- ("created" false), as a reader sees it (a lapsed claim reads `pending`).
-- The priority defaults to the flow's at enqueue time.
WITH inserted AS (
    INSERT INTO work_item (flow, ref, deadline, priority, payload)
    VALUES ($1, $2, $3,
            coalesce($4::smallint, (SELECT priority FROM flow WHERE name = $1), 2::smallint),
            $5)
    ON CONFLICT (ref) DO NOTHING
    RETURNING *
), found AS (
    SELECT * FROM inserted
    UNION ALL
    SELECT * FROM work_item WHERE ref = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
)
SELECT id AS "id!", flow AS "flow!", ref AS reference, deadline, priority AS "priority!",
       payload AS "payload!", work_state_now(state, lease_until) AS "state!", outcome,
       attempts AS "attempts!", claimed_by, enqueued_at AS "enqueued_at!", claimed_at,
       lease_until, done_at, not_before,
       EXISTS (SELECT 1 FROM inserted) AS "created!"
FROM found
