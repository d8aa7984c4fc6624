-- Every enqueue inserts an entry in each index of work_item, and every claim,
-- release and finish (each changes `state`, so none is a HOT update) one more
-- in each index whose predicate the new version meets. The two queue indexes
-- over every item not done (migration 20261130000003) have had no reader
-- since claims walk indexes of their own (migration 20261130000019: pending
-- items by flow and in rationing order, claimed ones by when their lease
-- runs out); a bench run of enqueues and claims scanned neither once. Two of
-- the eight entries an enqueue writes, and two of the six a claim writes,
-- were kept for nothing (an insert of twenty items: 11 % less database time
-- without them, 2026-12-01). Deleting a flow counts its open items through
-- the pending and lease indexes instead (sql/delete_flow.sql).
DROP INDEX work_item_queue_idx;
DROP INDEX work_item_flow_idx;
