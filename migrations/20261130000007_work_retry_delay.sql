-- Every claim spends a slot, so an item whose emission failed must not be
-- claimable again at once: a release sets when it may be claimed again.
-- `not_before` is that time (NULL: now). Only a pending item waits; a claim
-- clears it. A waiting item is still pending: the pending views count it.
ALTER TABLE work_item ADD COLUMN not_before timestamptz;
ALTER TABLE work_item ADD CONSTRAINT work_item_not_before_pending
    CHECK (not_before IS NULL OR state = 'pending');

-- The state a reader sees: a claim whose lease ran out is pending again (the
-- claims already treat it so), as in the views.
CREATE FUNCTION work_state_now(state text, lease_until timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN state = 'claimed' AND lease_until < arbiter_now() THEN 'pending' ELSE state END
$$;

-- Pending items waiting out a retry delay, per flow: how many, when the next
-- one becomes claimable, and the most attempts among them (a high number is
-- work that keeps failing).
CREATE VIEW work_waiting_by_flow AS
SELECT flow,
       count(*)        AS items,
       min(not_before) AS next_not_before,
       max(not_before) AS last_not_before,
       max(attempts)   AS most_attempts
FROM work_item
WHERE state = 'pending' AND not_before > arbiter_now()
GROUP BY flow;
