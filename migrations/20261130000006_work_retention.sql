-- Done work items are kept for `work_retention` (default 7 days), then pruned
-- in batches by every replica; this index finds the oldest ones.
CREATE INDEX work_item_done_idx ON work_item (done_at) WHERE state = 'done';
