-- Every quota's limits, as a replica's catalog holds them (src/catalog.rs).
-- Every replica reads this every 2 s and on each catalog change, so it reads
-- the limits alone: no effective cadence (list_quotas.sql, for the admin API,
-- joins each quota's bucket for it) and no order (a sort of the names by
-- collation). At 3,000 quotas: 0.5 ms, where list_quotas.sql took 9-10 ms.
SELECT name, hourly_ceiling, rate, burst, adaptive, max_in_flight,
       priority2_share, priority3_share
FROM quota
