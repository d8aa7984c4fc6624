-- Enqueue a group of work items in one statement (docs/design.md §9): item n
-- is flow $1[n], ref $2[n], deadline $3[n], priority $4[n] (NULL: the flow's
-- at enqueue time) and payload $5[n]. An item whose ref was seen before gets
-- the existing item instead ("created" false), as a reader sees it (a lapsed
-- claim reads `pending`); two items of the group with one ref get one item,
-- created for the first. Each item's id is drawn before the insert, so an
-- answer finds its own row whatever order the insert returns them in (the
-- sequence is looked up once: per item, pg_get_serial_sequence() was a tenth
-- of the statement).
-- One row per item, `n` its position (from 1); an item whose ref a concurrent
-- enqueue has inserted but not committed yet has no row: ask again.
WITH asked AS (
    SELECT a.n, nextval((SELECT pg_get_serial_sequence('work_item', 'id'))::regclass) AS id,
           a.flow, a.ref, a.deadline, a.priority, a.payload
    FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::smallint[], $5::jsonb[])
         WITH ORDINALITY AS a (flow, ref, deadline, priority, payload, n)
), inserted AS (
    INSERT INTO work_item (id, flow, ref, deadline, priority, payload)
    OVERRIDING SYSTEM VALUE
    SELECT a.id, a.flow, a.ref, a.deadline,
           coalesce(a.priority, f.priority, 2::smallint), a.payload
    FROM asked a
    LEFT JOIN flow f ON f.name = a.flow
    ORDER BY a.n
    ON CONFLICT (ref) DO NOTHING
    RETURNING *
), found AS (
    -- Each item's row, matched by key (hash joins, not a scan of every row
    -- for every item): the row it inserted; or, for an item whose ref came
    -- earlier in the group, the row inserted for the first; or the row of a
    -- ref seen before (this statement's snapshot does not see what it
    -- inserts).
    SELECT a.n, a.id AS asked_id, i.* FROM asked a JOIN inserted i ON i.id = a.id
    UNION ALL
    SELECT a.n, a.id, i.* FROM asked a JOIN inserted i ON i.ref = a.ref AND i.id <> a.id
    UNION ALL
    SELECT a.n, a.id, w.* FROM asked a JOIN work_item w ON w.ref = a.ref
    WHERE NOT EXISTS (SELECT 1 FROM inserted i WHERE i.ref = w.ref)
)
SELECT f.n AS "n!", f.id AS "id!", f.flow AS "flow!", f.ref AS reference, f.deadline,
       f.priority AS "priority!", f.payload AS "payload!",
       work_state_now(f.state, f.lease_until) AS "state!", f.outcome,
       f.attempts AS "attempts!", f.claimed_by, f.enqueued_at AS "enqueued_at!",
       f.claimed_at, f.lease_until, f.done_at, f.not_before,
       f.id = f.asked_id AS "created!"
FROM found f
ORDER BY f.n
