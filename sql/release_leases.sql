-- Frees the places held by leases $1[i] (a group of releases, design.md §8)
-- and feeds how long each was held into its flow's moving average, in one
-- statement: the emission's own duration $2[i] (seconds) when the worker
-- reported one, else the time since the lease was taken. A lease that
-- already expired and was taken again is not found: nothing happens to it.
-- With $3[i] (a flow) or $4[i] (a quota), a lease held by another flow or
-- quota is left alone and its holder returned instead. Each lease id once
-- (the caller sends a repeat in a statement after: the first freed it).
--
-- The average folds each flow's samples in the order given: n single
-- releases would each do avg = avg * 0.9 + held * 0.1 (the first sample of
-- a new flow sets it), so the group's n samples s_1 … s_n give
-- avg * 0.9^n + sum(0.1 * 0.9^(n-k) * s_k); from no row, s_1 * 0.9^(n-1) +
-- the same sum from k = 2 ("fresh"), which is also (avg - s_1) * 0.9^n +
-- fresh when a row is there. Places are locked in key order, then the
-- averages in flow order, as every statement that frees places does.
WITH asked AS (
    SELECT a.n, a.lease_id, a.held, a.flow_scope, a.quota_scope
    FROM unnest($1::bigint[], $2::float8[], $3::text[], $4::text[])
         WITH ORDINALITY AS a (lease_id, held, flow_scope, quota_scope, n)
), lease AS (
    SELECT a.n, s.quota, s.place, s.flow, s.taken_at, a.held, a.flow_scope, a.quota_scope
    FROM asked a
    JOIN quota_place s ON s.lease_id = a.lease_id
    ORDER BY s.quota, s.place
    FOR UPDATE OF s
), held AS (
    SELECT n, quota, place, flow,
           coalesce(held, extract(epoch FROM arbiter_now() - taken_at)::float8) AS seconds
    FROM lease
    WHERE (flow_scope IS NULL OR flow = flow_scope) AND (quota_scope IS NULL OR quota = quota_scope)
), freed AS (
    UPDATE quota_place s
    SET lease_id = NULL, flow = NULL, taken_at = NULL, valid_until = NULL
    FROM held h
    WHERE s.quota = h.quota AND s.place = h.place
    RETURNING h.n, h.flow, h.seconds
), samples AS (
    SELECT f.flow, f.seconds,
           row_number() OVER (PARTITION BY f.flow ORDER BY f.n) AS k,
           count(*) OVER (PARTITION BY f.flow) AS total
    FROM freed f
), folded AS (
    SELECT s.flow, max(s.total) AS total,
           sum(CASE WHEN s.k = 1 THEN s.seconds * power(0.9::float8, (s.total - 1)::float8)
                    ELSE 0.1 * s.seconds * power(0.9::float8, (s.total - s.k)::float8) END) AS fresh,
           sum(CASE WHEN s.k = 1 THEN s.seconds ELSE 0 END) AS first
    FROM samples s
    GROUP BY s.flow
), averaged AS (
    INSERT INTO flow_lease_duration AS d (flow, avg_seconds, samples)
    SELECT f.flow, f.fresh, f.total FROM folded f
    ORDER BY f.flow
    ON CONFLICT (flow) DO UPDATE
        SET avg_seconds = (d.avg_seconds - (SELECT f.first FROM folded f WHERE f.flow = d.flow))
                          * power(0.9::float8, EXCLUDED.samples::float8) + EXCLUDED.avg_seconds,
            samples = d.samples + EXCLUDED.samples
    RETURNING d.flow, d.avg_seconds
)
SELECT a.n::integer          AS "n!",
       f.flow                AS "flow?",
       f.seconds             AS "held_seconds?",
       v.avg_seconds         AS "avg_seconds?",
       l.flow                AS "holder_flow?",
       l.quota               AS "holder_quota?"
FROM asked a
LEFT JOIN freed f ON f.n = a.n
LEFT JOIN lease l ON l.n = a.n
LEFT JOIN averaged v ON v.flow = f.flow
ORDER BY a.n
