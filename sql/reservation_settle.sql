-- Settles reservation $1 of quota $2 (flow $3) at $4 slots spent, $5 of
-- them more than estimated (negative: fewer), in one statement: the windows
-- it was taken from that are still open (periods $6, starts $7, ends $8),
-- locked in key order, give back what was over-estimated (never below 0)
-- or take what was under-estimated, without any ceiling (it already
-- happened: a window may show count > ceiling); what was taken past the
-- estimate is tallied `overspent` in the reservation's hour; the
-- reservation is marked settled. Answers the windows adjusted, shortest
-- first, with their counts after.
WITH open AS (
    SELECT w.quota, w.period, w.window_start
    FROM quota_window w
    JOIN unnest($6::text[], $7::timestamptz[], $8::timestamptz[]) AS g (period, window_start, window_end)
      ON w.quota = $2 AND w.period = g.period AND w.window_start = g.window_start
    WHERE g.window_end > arbiter_now() AND $5::bigint <> 0
    ORDER BY w.quota, w.period
    FOR UPDATE OF w
), adjusted AS (
    UPDATE quota_window w
    SET count = greatest(0, w.count + $5::bigint)
    FROM open o
    WHERE w.quota = o.quota AND w.period = o.period AND w.window_start = o.window_start
    RETURNING w.period, w.window_start, w.count
), tallied AS (
    INSERT INTO decision_tally AS d (window_start, quota, flow, overspent)
    SELECT window_start_of(r.reserved_at), $2, $3, $5
    FROM reservation r
    WHERE r.id = $1 AND $5::bigint > 0
    ON CONFLICT ON CONSTRAINT decision_tally_key DO UPDATE
        SET overspent = d.overspent + EXCLUDED.overspent
), settled AS (
    UPDATE reservation SET settled_at = arbiter_now(), spent = $4 WHERE id = $1
)
SELECT coalesce(array_agg(a.period ORDER BY coalesce(period_seconds(a.period), 9999999999)), '{}') AS "periods!",
       coalesce(array_agg(a.count ORDER BY coalesce(period_seconds(a.period), 9999999999)), '{}') AS "counts!"
FROM adjusted a
