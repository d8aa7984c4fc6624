-- Worker $2 is done with item $1 ($3 = true: emitted; false: released back to
-- pending, its slot staying spent). Only the holder of the claim may finish
-- it, and only while nobody else has claimed it since. Finishing an item
-- already emitted by the same worker is a no-op that returns it. Also answers
-- the concurrency slot lease the claim held, for the caller to free.
WITH held AS (
    SELECT id, slot_lease_id FROM work_item WHERE id = $1 FOR UPDATE
), finished AS (
    UPDATE work_item AS w
    SET state         = CASE WHEN $3::boolean THEN 'done' ELSE 'pending' END,
        done_at       = CASE WHEN $3::boolean THEN coalesce(w.done_at, arbiter_now()) END,
        lease_until   = NULL,
        slot_lease_id = NULL
    FROM held h
    WHERE w.id = h.id AND w.claimed_by = $2
      AND (w.state = 'claimed' OR (w.state = 'done' AND $3::boolean))
    RETURNING w.id, w.flow, w.ref AS reference, w.deadline, w.priority, w.payload, w.state,
              w.outcome, w.attempts, w.claimed_by, w.enqueued_at, w.claimed_at, w.lease_until,
              w.done_at, h.slot_lease_id
)
SELECT id AS "id!", flow AS "flow!", reference, deadline, priority AS "priority!",
       payload AS "payload!", state AS "state!", outcome, attempts AS "attempts!", claimed_by,
       enqueued_at AS "enqueued_at!", claimed_at, lease_until, done_at, slot_lease_id
FROM finished
