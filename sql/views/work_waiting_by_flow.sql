-- Pending items waiting out a retry delay, per flow: how many, when the next
-- one becomes claimable, and the most attempts among them (a high number is
-- work that keeps failing).
CREATE OR REPLACE VIEW work_waiting_by_flow AS
SELECT flow,
       count(*)        AS items,
       min(not_before) AS next_not_before,
       max(not_before) AS last_not_before,
       max(attempts)   AS most_attempts
FROM work_item
WHERE state = 'pending' AND not_before > arbiter_now()
GROUP BY flow;
