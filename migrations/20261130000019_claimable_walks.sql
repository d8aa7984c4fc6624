-- Claims walk only what they may claim. The queue indexes cover every item
-- not done, so a claim walked past every item claimed before it (a lease
-- still running) and, looking for work of flows the arbiter does not
-- throttle, past the whole backlog: 20 ms a walk with 60,000 items queued.
-- Pending items get indexes of their own, in rationing order; claimed items
-- are found by when their lease runs out, so a walk for lapsed leases reads
-- only those (by flow where the claim names its flows: with the flow in the
-- index the planner never prefers walking a queue index past every claimed
-- item, even on statistics that lag a fast-growing queue).
CREATE INDEX work_item_pending_flow_idx ON work_item (flow, deadline, priority, id)
    WHERE state = 'pending';
CREATE INDEX work_item_pending_queue_idx ON work_item (deadline, priority, id)
    WHERE state = 'pending';
CREATE INDEX work_item_lease_idx ON work_item (lease_until)
    WHERE state = 'claimed';
CREATE INDEX work_item_lease_flow_idx ON work_item (flow, lease_until)
    WHERE state = 'claimed';
