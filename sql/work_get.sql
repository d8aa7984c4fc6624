SELECT id, flow, ref AS reference, deadline, priority, payload, state, outcome, attempts,
       claimed_by, enqueued_at, claimed_at, lease_until, done_at
FROM work_item
WHERE id = $1
