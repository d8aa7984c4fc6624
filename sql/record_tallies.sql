-- Add a batch of decision tallies (observation only, written off the hot path).
-- A NULL window means "the hour the database clock is in now".
INSERT INTO decision_tally AS d
    (window_start, quota, flow, granted, deferred, would_defer, bypassed, unthrottled,
     would_defer_with_deadline)
SELECT coalesce(t.window_start, window_start_of(arbiter_now())), t.quota, t.flow,
       sum(t.granted), sum(t.deferred), sum(t.would_defer), sum(t.bypassed), sum(t.unthrottled),
       sum(t.would_defer_with_deadline)
FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
            $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[])
     AS t (window_start, quota, flow, granted, deferred, would_defer, bypassed, unthrottled,
           would_defer_with_deadline)
GROUP BY 1, 2, 3
ON CONFLICT ON CONSTRAINT decision_tally_key DO UPDATE
    SET granted     = d.granted + EXCLUDED.granted,
        deferred    = d.deferred + EXCLUDED.deferred,
        would_defer = d.would_defer + EXCLUDED.would_defer,
        bypassed    = d.bypassed + EXCLUDED.bypassed,
        unthrottled = d.unthrottled + EXCLUDED.unthrottled,
        would_defer_with_deadline = d.would_defer_with_deadline + EXCLUDED.would_defer_with_deadline
