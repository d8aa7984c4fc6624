-- A group of finishes (docs/design.md §8), each item once: worker $2[i] is
-- done with item $1[i] ($3[i] = true: emitted; false: released back to
-- pending, its slot staying spent). Only the holder of the claim may finish
-- it, and only while nobody else has claimed it since. Finishing an item
-- already emitted by the same worker is a no-op that returns it. A release
-- drops what only the claim held (holder, lease, in-flight place lease) and
-- sets when the item may be claimed again, by the database clock: at $5[i],
-- or $4[i] seconds from now, or else after the default backoff of $6
-- seconds doubled for every claim after the first, at most $7 seconds;
-- never before now, never more than $8 seconds ahead. Items are locked in
-- id order; each is found by key and reads its own numbers by its position
-- in the arrays. Answers each finished item with its position and the
-- in-flight place lease its claim held, for the caller to free; an item not
-- finished has no row.
WITH held AS (
    SELECT w.id, w.place_lease_id, array_position($1::bigint[], w.id) AS p
    FROM work_item w
    WHERE w.id = ANY ($1::bigint[])
    ORDER BY w.id
    FOR UPDATE
), finished AS (
    UPDATE work_item AS w
    SET state         = CASE WHEN ($3::boolean[])[h.p] THEN 'done' ELSE 'pending' END,
        done_at       = CASE WHEN ($3::boolean[])[h.p] THEN coalesce(w.done_at, arbiter_now()) END,
        claimed_by    = CASE WHEN ($3::boolean[])[h.p] THEN w.claimed_by END,
        claimed_at    = CASE WHEN ($3::boolean[])[h.p] THEN w.claimed_at END,
        lease_until   = NULL,
        place_lease_id = NULL,
        not_before    = CASE WHEN NOT ($3::boolean[])[h.p] THEN
            arbiter_now() + make_interval(secs => least($8::float8, greatest(0::float8, coalesce(
                extract(epoch FROM ($5::timestamptz[])[h.p] - arbiter_now())::float8,
                ($4::float8[])[h.p],
                least($7::float8,
                      $6::float8 * power(2::float8, least(greatest(w.attempts - 1, 0), 60))))))) END
    FROM held h
    WHERE w.id = h.id AND w.claimed_by = ($2::text[])[h.p]
      AND (w.state = 'claimed' OR (w.state = 'done' AND ($3::boolean[])[h.p]))
    RETURNING h.p, w.id, w.flow, w.ref AS reference, w.deadline, w.priority, w.payload, w.state,
              w.outcome, w.attempts, w.claimed_by, w.enqueued_at, w.claimed_at, w.lease_until,
              w.done_at, w.not_before, w.spend, h.place_lease_id
)
SELECT p AS "position!", id AS "id!", flow AS "flow!", reference, deadline,
       priority AS "priority!", payload AS "payload!", state AS "state!", outcome,
       attempts AS "attempts!", claimed_by, enqueued_at AS "enqueued_at!", claimed_at,
       lease_until, done_at, not_before, spend, place_lease_id
FROM finished
