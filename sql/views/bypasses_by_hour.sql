-- Deadline bypasses per hour and flow.
CREATE OR REPLACE VIEW bypasses_by_hour AS
SELECT d.window_start, d.quota, d.flow, sum(d.bypassed)::bigint AS bypassed
FROM decision_tally d
WHERE d.bypassed > 0
GROUP BY d.window_start, d.quota, d.flow;
