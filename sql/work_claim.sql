-- Lease the items $1 (already locked by this transaction) to worker $2 for $3
-- seconds, each with the outcome of its decision ($4).
UPDATE work_item AS w
SET state       = 'claimed',
    outcome     = t.outcome,
    claimed_by  = $2,
    claimed_at  = arbiter_now(),
    lease_until = arbiter_now() + make_interval(secs => $3::float8),
    attempts    = w.attempts + 1
FROM unnest($1::bigint[], $4::text[]) AS t (id, outcome)
WHERE w.id = t.id
RETURNING w.id, w.flow, w.ref AS reference, w.deadline, w.priority, w.payload, w.state, w.outcome,
          w.attempts, w.claimed_by, w.enqueued_at, w.claimed_at, w.lease_until, w.done_at
