-- Work not done whose deadline has passed, most overdue first.
CREATE OR REPLACE VIEW work_past_deadline AS
SELECT id, flow, ref, deadline, arbiter_now() - deadline AS overdue_by,
       CASE WHEN state = 'claimed' AND lease_until < arbiter_now() THEN 'pending' ELSE state END AS state,
       attempts, claimed_by, enqueued_at, lease_until
FROM work_item
WHERE state <> 'done' AND deadline < arbiter_now()
ORDER BY deadline, id;
