-- The enqueue statement (sql/work_enqueue.sql) as a function whose plan is
-- made without sequential scans, the way the claim's statements are planned
-- (sql/claim_plan_settings.sql).
-- A prepared statement keeps its generic plan for as long as the connection
-- lives, and one made while the registry was empty or nearly so (a new
-- deployment, the first enqueues of a run) found the rows of refs seen before
-- by reading the whole table into a hash: at 40,000 items, 6.8 ms a group of
-- 32 where the ref index takes under 0.1 ms, until a vacuum or an analyze of the
-- table happened to invalidate the plan (measured 2026-12-01: the bench's
-- enqueue arm read 28 million rows in 1,344 groups). A function's SET clause
-- is the one place a single statement can take planner settings.
-- The flow's priority (for items that give none) is a probe of the flow's
-- key per item, not a hash of the whole flow table per group.
CREATE OR REPLACE FUNCTION enqueue_work(
    p_flows text[], p_refs text[], p_deadlines timestamptz[], p_priorities smallint[],
    p_payloads jsonb[], p_spends jsonb[]
) RETURNS TABLE (
    o_n bigint, o_id bigint, o_flow text, o_ref text, o_deadline timestamptz,
    o_priority smallint, o_payload jsonb, o_state text, o_outcome text, o_attempts integer,
    o_claimed_by text, o_enqueued_at timestamptz, o_claimed_at timestamptz,
    o_lease_until timestamptz, o_done_at timestamptz, o_not_before timestamptz,
    o_spend jsonb, o_created boolean
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH asked AS (
        SELECT a.n, nextval((SELECT pg_get_serial_sequence('work_item', 'id'))::regclass) AS id,
               a.flow, a.ref, a.deadline, a.priority, a.payload, a.spend
        FROM unnest(p_flows, p_refs, p_deadlines, p_priorities, p_payloads, p_spends)
             WITH ORDINALITY AS a (flow, ref, deadline, priority, payload, spend, n)
    ), inserted AS (
        INSERT INTO work_item (id, flow, ref, deadline, priority, payload, spend)
        OVERRIDING SYSTEM VALUE
        SELECT a.id, a.flow, a.ref, a.deadline,
               coalesce(a.priority, (SELECT f.priority FROM flow f WHERE f.name = a.flow), 2::smallint),
               a.payload, a.spend
        FROM asked a
        ORDER BY a.n
        ON CONFLICT (ref) DO NOTHING
        RETURNING *
    ), found AS (
        -- Each item's row, matched by key (not a scan of every row for every
        -- item): the row it inserted; or, for an item whose ref came earlier in
        -- the group, the row inserted for the first; or the row of a ref seen
        -- before, found by the ref's index (this statement's snapshot does not
        -- see what it inserts).
        SELECT a.n, a.id AS asked_id, i.* FROM asked a JOIN inserted i ON i.id = a.id
        UNION ALL
        SELECT a.n, a.id, i.* FROM asked a JOIN inserted i ON i.ref = a.ref AND i.id <> a.id
        UNION ALL
        SELECT a.n, a.id, w.* FROM asked a JOIN work_item w ON w.ref = a.ref
        WHERE NOT EXISTS (SELECT 1 FROM inserted i WHERE i.ref = w.ref)
    )
    SELECT f.n, f.id, f.flow, f.ref, f.deadline, f.priority, f.payload,
           work_state_now(f.state, f.lease_until), f.outcome, f.attempts, f.claimed_by,
           f.enqueued_at, f.claimed_at, f.lease_until, f.done_at, f.not_before, f.spend,
           f.id = f.asked_id
    FROM found f
    ORDER BY f.n;
END
$$;
