-- What claiming a work item spends of its flow's quotas (docs/design.md §12):
-- `{"quota": amount, …}`, the quotas it does not name one each; NULL: one of
-- each. Such an item, and every item of a flow that spends several quotas,
-- is decided when claimed the way a reservation with `spend` is.
ALTER TABLE work_item ADD COLUMN spend jsonb
    CONSTRAINT work_item_spend_is_an_object CHECK (spend IS NULL OR jsonb_typeof(spend) = 'object');

-- enqueue_work() takes and answers `spend` now: a new signature, created by
-- the migrate's functions step (sql/functions/enqueue_work.sql).
DROP FUNCTION IF EXISTS enqueue_work(text[], text[], timestamptz[], smallint[], jsonb[]);

-- The pending items that carry a `spend`, walked by flow in rationing order
-- (sql/work_candidates_with_spend.sql): a claim looks for them in every flow
-- of one quota it claims from, and most flows have none, which this index
-- answers at once where the pending walk would read the flow's backlog.
CREATE INDEX work_item_pending_spend_idx ON work_item (flow, deadline, priority, id)
    WHERE state = 'pending' AND spend IS NOT NULL;
