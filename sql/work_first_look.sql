-- A claim's first look, in one statement, before it takes any slot:
--   due:         items of the worker's flows $1 (NULL: all) whose deadline is
--                within the bypass horizon ($2 seconds), locked: they are
--                claimed as bypassed, without a reservation;
--   unthrottled: items outside the horizon of the flows the arbiter does not
--                throttle (count mode, or no flow of that name: by the flow
--                table itself, so a flow being flipped to enforce or observe
--                is never taken for unthrottled by a replica that has not
--                reloaded yet), locked;
--   busy:        which of the enforced flows $4 hold claimable work outside
--                the horizon: a hint that spares the claim a take (and a row
--                lock) on quotas with nothing to claim; it never decides who
--                gets a slot. One short index probe per flow.
-- Up to $3 items per locked lane, most urgent first (deadline ASC NULLS LAST,
-- priority, first come first served); claimable means pending and past its
-- retry delay (`not_before`: due items too, the worker asked for the delay),
-- or claimed with a lease that ran out; rows another claim holds are skipped.
-- Pending items are walked on their own indexes, in order; lapsed leases are
-- read by when they ran out (few) and sorted (the order written as an
-- expression, so no queue index tempts the planner into walking every claimed
-- item in order instead); each lane keeps the best $3 of both. The
-- unthrottled lane walks flow by flow: the worker's flows, or (NULL) every
-- flow with pending work, found by skipping through the flow index one flow
-- at a time, never by reading the backlog of throttled flows.
-- (coalesce() rather than "deadline IS NULL OR …" keeps the walks in index
-- order.) Whether a flow is throttled is a lookup of its name: as a scalar
-- subquery, one probe of the flow's key per name; as NOT EXISTS, it was planned
-- as a hash of the whole flow table, built for every claim group. With 2,000
-- flows in the catalog, that and a walk of every running lease to find the
-- lapsed ones (work_item_lease_idx reads the lapsed ones only) made the look
-- 0.55 ms a group in the bench; 0.05 ms without them (2026-12-01).
WITH RECURSIVE pending_flows AS (
    (SELECT flow FROM work_item
     WHERE state = 'pending' AND $1::text[] IS NULL
     ORDER BY flow LIMIT 1)
    UNION ALL
    SELECT (SELECT w.flow FROM work_item w
            WHERE w.state = 'pending' AND w.flow > p.flow
            ORDER BY w.flow LIMIT 1)
    FROM pending_flows p
    WHERE p.flow IS NOT NULL
), unthrottled_flows AS (
    SELECT DISTINCT name
    FROM (SELECT unnest($1::text[]) AS name
          UNION ALL
          SELECT flow FROM pending_flows WHERE flow IS NOT NULL) AS named
    WHERE coalesce((SELECT fl.mode FROM flow fl WHERE fl.name = named.name), 'count') = 'count'
), due_pending AS (
    SELECT id, flow, deadline, priority, ref, spend
    FROM work_item
    WHERE state = 'pending'
      AND coalesce(not_before <= arbiter_now(), true)
      AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
      AND deadline <= arbiter_now() + make_interval(secs => $2::float8)
    ORDER BY deadline ASC NULLS LAST, priority, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), lapsed AS (
    -- Every lapsed lease the worker may claim, whatever its lane.
    SELECT id, flow, deadline, priority, ref, spend
    FROM work_item
    WHERE state = 'claimed' AND lease_until < arbiter_now()
      AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
      AND (deadline <= arbiter_now() + make_interval(secs => $2::float8)
           OR coalesce((SELECT fl.mode FROM flow fl WHERE fl.name = work_item.flow), 'count') = 'count')
    ORDER BY coalesce(deadline, 'infinity'), priority, id
    LIMIT 2 * $3
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT * FROM due_pending
    UNION ALL
    SELECT * FROM lapsed WHERE deadline <= arbiter_now() + make_interval(secs => $2::float8)
    ORDER BY deadline ASC NULLS LAST, priority, id
    LIMIT $3
), unthrottled_pending AS (
    SELECT c.id, c.flow, c.deadline, c.priority, c.ref, c.spend
    FROM unthrottled_flows AS f,
    LATERAL (
        SELECT id, flow, deadline, priority, ref, spend
        FROM work_item
        WHERE state = 'pending'
          AND coalesce(not_before <= arbiter_now(), true)
          AND flow = f.name
          AND coalesce(deadline > arbiter_now() + make_interval(secs => $2::float8), true)
        ORDER BY deadline ASC NULLS LAST, priority, id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS c
), unthrottled AS (
    SELECT * FROM unthrottled_pending
    UNION ALL
    SELECT * FROM lapsed
    WHERE coalesce((SELECT fl.mode FROM flow fl WHERE fl.name = lapsed.flow), 'count') = 'count'
      AND coalesce(deadline > arbiter_now() + make_interval(secs => $2::float8), true)
    ORDER BY deadline ASC NULLS LAST, priority, id
    LIMIT $3
), busy AS (
    SELECT f.name AS flow
    FROM unnest($4::text[]) AS f (name)
    WHERE EXISTS (
        -- The flow's pending walk, stopped at the first claimable item (as a
        -- walk in order with a limit: a bare EXISTS may be planned as a
        -- bitmap of every pending item of the flow).
        SELECT 1 FROM (
            SELECT 1 FROM work_item w
            WHERE w.flow = f.name
              AND w.state = 'pending'
              AND coalesce(w.not_before <= arbiter_now(), true)
              AND coalesce(w.deadline > arbiter_now() + make_interval(secs => $2::float8), true)
            ORDER BY w.deadline ASC NULLS LAST, w.priority, w.id
            LIMIT 1
        ) AS first_claimable
    ) OR EXISTS (
        SELECT 1 FROM work_item w
        WHERE w.state = 'claimed' AND w.lease_until < arbiter_now()
          AND w.flow = f.name
          AND coalesce(w.deadline > arbiter_now() + make_interval(secs => $2::float8), true)
    )
)
SELECT 'due' AS "lane!", id, flow AS "flow!", deadline, priority, ref AS reference, spend FROM due
UNION ALL
SELECT 'unthrottled', id, flow, deadline, priority, ref, spend FROM unthrottled
UNION ALL
SELECT 'busy', NULL, flow, NULL, NULL, NULL, NULL FROM busy
