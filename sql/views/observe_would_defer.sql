-- Per flow and hour: decisions that enforcement would have deferred, for flows
-- that are still in observe mode.
CREATE OR REPLACE VIEW observe_would_defer AS
SELECT d.flow, d.quota, d.window_start,
       sum(d.granted)::bigint                   AS decisions,
       sum(d.would_defer)::bigint               AS would_defer,
       sum(d.would_defer_with_deadline)::bigint AS would_defer_with_deadline
FROM decision_tally d
JOIN flow f ON f.name = d.flow AND f.mode = 'observe'
GROUP BY d.flow, d.quota, d.window_start;
