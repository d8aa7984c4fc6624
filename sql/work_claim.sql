-- Lease the items $1 (already locked by this transaction), each to its worker
-- ($2) for its lease ($3 seconds): the claims that shared this transaction
-- each lease their own items. With each item, the outcome of its decision
-- ($4) and the concurrency place lease it holds, if its quota has
-- `max_in_flight` ($5, NULL otherwise).
-- The items are found by key (`id = ANY`), each one's numbers by its position
-- in $1: joined to the unnested arrays instead, a plan made while the
-- registry was nearly empty merged them with a walk of the whole primary key
-- (10 ms a group at 20,000 items claimed).
UPDATE work_item AS w
SET state         = 'claimed',
    outcome       = ($4::text[])[array_position($1::bigint[], w.id)],
    claimed_by    = ($2::text[])[array_position($1::bigint[], w.id)],
    claimed_at    = arbiter_now(),
    lease_until   = arbiter_now()
                    + make_interval(secs => ($3::float8[])[array_position($1::bigint[], w.id)]),
    attempts      = w.attempts + 1,
    place_lease_id = ($5::bigint[])[array_position($1::bigint[], w.id)],
    not_before    = NULL
WHERE w.id = ANY($1::bigint[])
RETURNING w.id, w.flow, w.ref AS reference, w.deadline, w.priority, w.payload, w.state, w.outcome,
          w.attempts, w.claimed_by, w.enqueued_at, w.claimed_at, w.lease_until, w.done_at,
          w.not_before, w.spend
