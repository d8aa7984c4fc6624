-- Settles reservation $1 (flow $2) in one statement: quota $3[i] at $4[i]
-- slots spent, $5[i] of them more than estimated (negative: fewer). The
-- windows it was taken from that are still open (window j of quota $6[j],
-- period $7[j], starting $8[j], ending $9[j]), locked in key order, give
-- back what was over-estimated (never below 0) or take what was
-- under-estimated, without any ceiling (it already happened: a window may
-- show count > ceiling); what was taken past an estimate is tallied
-- `overspent` for its quota in the reservation's hour; the reservation is
-- marked settled. Answers the windows adjusted, by quota, shortest first,
-- with their counts after.
WITH leg AS (
    SELECT g.quota, g.period, g.window_start, d.more
    FROM unnest($6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[])
         AS g (quota, period, window_start, window_end)
    JOIN unnest($3::text[], $5::bigint[]) AS d (quota, more) ON d.quota = g.quota
    WHERE g.window_end > arbiter_now() AND d.more <> 0
), open AS (
    SELECT w.quota, w.period, w.window_start, l.more
    FROM quota_window w
    JOIN leg l ON w.quota = l.quota AND w.period = l.period AND w.window_start = l.window_start
    ORDER BY w.quota, w.period
    FOR UPDATE OF w
), adjusted AS (
    UPDATE quota_window w
    SET count = greatest(0, w.count + o.more)
    FROM open o
    WHERE w.quota = o.quota AND w.period = o.period AND w.window_start = o.window_start
    RETURNING w.quota, w.period, w.count
), tallied AS (
    INSERT INTO decision_tally AS d (window_start, quota, flow, overspent)
    SELECT window_start_of(r.reserved_at), r.quota, $2, s.more
    FROM reservation r
    JOIN unnest($3::text[], $5::bigint[]) AS s (quota, more) ON s.quota = r.quota
    WHERE r.id = $1 AND s.more > 0
    ON CONFLICT ON CONSTRAINT decision_tally_key DO UPDATE
        SET overspent = d.overspent + EXCLUDED.overspent
), settled AS (
    UPDATE reservation r
    SET settled_at = arbiter_now(), spent = s.spent
    FROM unnest($3::text[], $4::bigint[]) AS s (quota, spent)
    WHERE r.id = $1 AND r.quota = s.quota
)
SELECT coalesce(array_agg(a.quota ORDER BY a.quota, coalesce(period_seconds(a.period), 9999999999)), '{}') AS "quotas!",
       coalesce(array_agg(a.period ORDER BY a.quota, coalesce(period_seconds(a.period), 9999999999)), '{}') AS "periods!",
       coalesce(array_agg(a.count ORDER BY a.quota, coalesce(period_seconds(a.period), 9999999999)), '{}') AS "counts!"
FROM adjusted a
