-- What claiming a work item spends of its flow's quotas (docs/design.md §12):
-- `{"quota": amount, …}`, the quotas it does not name one each; NULL: one of
-- each. Such an item, and every item of a flow that spends several quotas,
-- is decided when claimed the way a reservation with `spend` is.
ALTER TABLE work_item ADD COLUMN spend jsonb
    CONSTRAINT work_item_spend_is_an_object CHECK (spend IS NULL OR jsonb_typeof(spend) = 'object');

-- enqueue_work() takes and answers `spend` now: a new signature, created by
-- the migrate's functions step (sql/functions/enqueue_work.sql).
DROP FUNCTION IF EXISTS enqueue_work(text[], text[], timestamptz[], smallint[], jsonb[]);
