-- Every quota's limits, as a replica's catalog holds them (src/catalog.rs),
-- its windows shortest first as parallel arrays. Every replica reads this
-- every 2 s and on each catalog change, so it reads the limits alone: no
-- effective cadence (list_quotas.sql, for the admin API, joins each quota's
-- bucket for it) and no order of quotas (a sort of the names by collation).
-- At 3,000 quotas: 0.5 ms, where list_quotas.sql took 9-10 ms.
SELECT q.name, q.rate, q.burst, q.adaptive, q.max_in_flight, q.priority2_share, q.priority3_share,
       coalesce(w.periods, '{}') AS "periods!", coalesce(w.ceilings, '{}') AS "ceilings!",
       coalesce(w.zones, '{}') AS "zones!: Vec<Option<String>>"
FROM quota q
LEFT JOIN (
    SELECT p.quota, array_agg(p.period) AS periods, array_agg(p.ceiling) AS ceilings,
           array_agg(p.zone) AS zones
    FROM quota_period p
    GROUP BY p.quota
) w ON w.quota = q.name
