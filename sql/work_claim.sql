-- Lease the items $1 (already locked by this transaction), each to its worker
-- ($2) for its lease ($3 seconds): the claims that shared this transaction
-- each lease their own items. With each item, the outcome of its decision
-- ($4) and the concurrency place lease it holds, if its quota has
-- `max_in_flight` ($5, NULL otherwise).
UPDATE work_item AS w
SET state         = 'claimed',
    outcome       = t.outcome,
    claimed_by    = t.worker,
    claimed_at    = arbiter_now(),
    lease_until   = arbiter_now() + make_interval(secs => t.lease_seconds),
    attempts      = w.attempts + 1,
    place_lease_id = t.place_lease_id,
    not_before    = NULL
FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::text[], $5::bigint[])
     AS t (id, worker, lease_seconds, outcome, place_lease_id)
WHERE w.id = t.id
RETURNING w.id, w.flow, w.ref AS reference, w.deadline, w.priority, w.payload, w.state, w.outcome,
          w.attempts, w.claimed_by, w.enqueued_at, w.claimed_at, w.lease_until, w.done_at,
          w.not_before
