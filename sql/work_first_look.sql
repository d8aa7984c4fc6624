-- A claim's first look, in one statement, before it takes any slot:
--   due:         items of the worker's flows $1 (NULL: all) whose deadline is
--                within the bypass horizon ($2 seconds), locked: they are
--                claimed as bypassed, without a reservation;
--   unthrottled: items outside the horizon of the flows NOT in $4 (the ones
--                the arbiter does not throttle), locked;
--   busy:        which of the enforced flows $5 hold claimable work outside
--                the horizon: a hint that spares the claim a take (and a row
--                lock) on quotas with nothing to claim; it never decides who
--                gets a slot. One short index probe per flow.
-- Up to $3 items per locked lane, most urgent first (deadline ASC NULLS LAST,
-- priority, first come first served); claimable means pending and past its
-- retry delay (`not_before`: due items too, the worker asked for the delay),
-- or claimed with a lease that ran out; rows another claim holds are skipped.
-- (coalesce() rather than "deadline IS NULL OR …" keeps the walks in index
-- order.)
WITH due AS (
    SELECT id, flow, deadline, priority, ref
    FROM work_item
    WHERE state <> 'done' AND (state = 'pending' OR lease_until < arbiter_now())
      AND coalesce(not_before <= arbiter_now(), true)
      AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
      AND deadline <= arbiter_now() + make_interval(secs => $2::float8)
    ORDER BY deadline ASC NULLS LAST, priority, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), unthrottled AS (
    SELECT id, flow, deadline, priority, ref
    FROM work_item
    WHERE state <> 'done' AND (state = 'pending' OR lease_until < arbiter_now())
      AND coalesce(not_before <= arbiter_now(), true)
      AND flow <> ALL($4::text[])
      AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
      AND coalesce(deadline > arbiter_now() + make_interval(secs => $2::float8), true)
    ORDER BY deadline ASC NULLS LAST, priority, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), busy AS (
    SELECT f.name AS flow
    FROM unnest($5::text[]) AS f (name)
    WHERE EXISTS (
        SELECT 1 FROM work_item w
        WHERE w.flow = f.name
          AND w.state <> 'done'
          AND (w.state = 'pending' OR w.lease_until < arbiter_now())
          AND coalesce(w.not_before <= arbiter_now(), true)
          AND coalesce(w.deadline > arbiter_now() + make_interval(secs => $2::float8), true)
    )
)
SELECT 'due' AS "lane!", id, flow AS "flow!", deadline, priority, ref AS reference FROM due
UNION ALL
SELECT 'unthrottled', id, flow, deadline, priority, ref FROM unthrottled
UNION ALL
SELECT 'busy', NULL, flow, NULL, NULL, NULL FROM busy
