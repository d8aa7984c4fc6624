-- One work item as a reader sees it: a claim whose lease ran out reads
-- `pending` (its past `lease_until` and `claimed_by` say whose lapsed).
SELECT id, flow, ref AS reference, deadline, priority, payload,
       work_state_now(state, lease_until) AS "state!", outcome, attempts,
       claimed_by, enqueued_at, claimed_at, lease_until, done_at, not_before, spend
FROM work_item
WHERE id = $1
