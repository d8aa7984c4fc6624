-- Worker $2 is done with item $1 ($3 = true: emitted; false: released back to
-- pending, its slot staying spent). Only the holder of the claim may finish
-- it, and only while nobody else has claimed it since. Finishing an item
-- already emitted by the same worker is a no-op that returns it.
UPDATE work_item
SET state       = CASE WHEN $3::boolean THEN 'done' ELSE 'pending' END,
    done_at     = CASE WHEN $3::boolean THEN coalesce(done_at, arbiter_now()) END,
    lease_until = NULL
WHERE id = $1 AND claimed_by = $2
  AND (state = 'claimed' OR (state = 'done' AND $3::boolean))
RETURNING id, flow, ref AS reference, deadline, priority, payload, state, outcome, attempts,
          claimed_by, enqueued_at, claimed_at, lease_until, done_at
