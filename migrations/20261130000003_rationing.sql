-- Rationing: reservations that take up to k slots in one statement (batches,
-- claims), and the registry of pending work that claims ration globally.

-- How many slots the last take-up-to-k upsert on this row took. RETURNING only
-- sees the new row, so the amount taken travels back in this column from the
-- same single statement (no read-then-write).
ALTER TABLE quota_window ADD COLUMN last_take bigint NOT NULL DEFAULT 0;

-- Pending work. A claim is a lease: `claimed` with `lease_until` in the past
-- counts as pending again (the worker died); its slot stays spent.
CREATE TABLE work_item (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Not a foreign key: a flow the arbiter does not know is never throttled.
    flow        text NOT NULL CHECK (flow ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    -- The caller's idempotency key: enqueueing the same ref twice is one item.
    ref         text UNIQUE CHECK (length(ref) BETWEEN 1 AND 256),
    deadline    timestamptz,
    -- The flow's priority at enqueue time unless the item named its own.
    priority    smallint NOT NULL CHECK (priority BETWEEN 1 AND 9),
    payload     jsonb NOT NULL,
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'claimed', 'done')),
    -- How the last claim was decided: granted (a slot), bypassed, unthrottled.
    outcome     text CHECK (outcome IN ('granted', 'bypassed', 'unthrottled')),
    attempts    integer NOT NULL DEFAULT 0,
    claimed_by  text,
    enqueued_at timestamptz NOT NULL DEFAULT arbiter_now(),
    claimed_at  timestamptz,
    lease_until timestamptz,
    done_at     timestamptz,
    CHECK ((state = 'claimed') = (lease_until IS NOT NULL)),
    CHECK ((state = 'done') = (done_at IS NOT NULL))
);

-- Rationing order over what is not done yet: deadline ASC NULLS LAST (the
-- btree default), then priority, then first come first served.
CREATE INDEX work_item_queue_idx ON work_item (deadline, priority, id) WHERE state <> 'done';
CREATE INDEX work_item_flow_idx ON work_item (flow, deadline, priority, id) WHERE state <> 'done';

-- Pending work (claims whose lease ran out included) by flow and deadline bucket.
CREATE VIEW work_pending_by_flow AS
SELECT flow,
       bucket.rank AS bucket_rank,
       bucket.name AS deadline_bucket,
       count(*)         AS items,
       min(deadline)    AS earliest_deadline,
       min(enqueued_at) AS oldest_enqueued_at
FROM work_item,
LATERAL (SELECT * FROM (VALUES
    (1, 'past deadline',   deadline < arbiter_now()),
    (2, 'within 15 min',   deadline < arbiter_now() + interval '15 minutes'),
    (3, 'within 1 hour',   deadline < arbiter_now() + interval '1 hour'),
    (4, 'within 1 day',    deadline < arbiter_now() + interval '1 day'),
    (5, 'later',           deadline IS NOT NULL),
    (6, 'no deadline',     deadline IS NULL)) AS b (rank, name, hit)
    WHERE b.hit ORDER BY b.rank LIMIT 1) AS bucket
WHERE state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now())
GROUP BY flow, bucket.rank, bucket.name;

-- Work not done whose deadline has passed, most overdue first.
CREATE VIEW work_past_deadline AS
SELECT id, flow, ref, deadline, arbiter_now() - deadline AS overdue_by,
       CASE WHEN state = 'claimed' AND lease_until < arbiter_now() THEN 'pending' ELSE state END AS state,
       attempts, claimed_by, enqueued_at, lease_until
FROM work_item
WHERE state <> 'done' AND deadline < arbiter_now()
ORDER BY deadline, id;

-- The oldest pending item of each flow and how long it has waited.
CREATE VIEW work_oldest_pending AS
SELECT DISTINCT ON (flow)
       flow, id, ref, deadline, priority, enqueued_at,
       arbiter_now() - enqueued_at AS waiting_for, attempts
FROM work_item
WHERE state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now())
ORDER BY flow, enqueued_at, id;
