-- Per quota of $1 and hour from $2 on: the decisions that spent the quota
-- (granted, bypassed, unthrottled) of every flow that spends it. The what-if
-- report spreads a window longer than an hour over its hours by these.
SELECT q.name                                              AS "quota!",
       d.window_start                                      AS "window_start!",
       sum(d.granted + d.bypassed + d.unthrottled)::bigint AS "spent!"
FROM flow f
CROSS JOIN LATERAL unnest(array_prepend(f.quota, f.further_quotas)) AS q (name)
JOIN decision_tally d ON d.flow = f.name
WHERE q.name = ANY($1::text[])
  AND d.window_start >= $2
GROUP BY q.name, d.window_start
ORDER BY q.name, d.window_start
