-- The oldest pending item of each flow and how long it has waited.
CREATE OR REPLACE VIEW work_oldest_pending AS
SELECT DISTINCT ON (flow)
       flow, id, ref, deadline, priority, enqueued_at,
       arbiter_now() - enqueued_at AS waiting_for, attempts
FROM work_item
WHERE state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now())
ORDER BY flow, enqueued_at, id;
