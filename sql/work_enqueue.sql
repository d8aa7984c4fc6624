-- Enqueue a group of work items in one statement (docs/design.md §9): item n
-- is flow $1[n], ref $2[n], deadline $3[n], priority $4[n] (NULL: the flow's
-- at enqueue time), payload $5[n] and spend $6[n] (NULL: one of each quota).
-- An item whose ref was seen before gets the existing item instead ("created"
-- false), as a reader sees it (a lapsed claim reads `pending`); two items of
-- the group with one ref get one item, created for the first. Each item's id
-- is drawn before the insert, so an answer finds its own row whatever order
-- the insert returns them in.
-- The statement is enqueue_work() (sql/functions/enqueue_work.sql, which says
-- why it is a function: its plan is made without sequential scans).
-- One row per item, `n` its position (from 1); an item whose ref a concurrent
-- enqueue has inserted but not committed yet has no row: ask again.
SELECT t.o_n AS "n!", t.o_id AS "id!", t.o_flow AS "flow!", t.o_ref AS reference,
       t.o_deadline AS deadline, t.o_priority AS "priority!", t.o_payload AS "payload!",
       t.o_state AS "state!", t.o_outcome AS outcome, t.o_attempts AS "attempts!",
       t.o_claimed_by AS claimed_by, t.o_enqueued_at AS "enqueued_at!",
       t.o_claimed_at AS claimed_at, t.o_lease_until AS lease_until, t.o_done_at AS done_at,
       t.o_not_before AS not_before, t.o_spend AS spend, t.o_created AS "created!"
FROM enqueue_work($1::text[], $2::text[], $3::timestamptz[], $4::smallint[], $5::jsonb[],
                  $6::jsonb[]) AS t
ORDER BY t.o_n
