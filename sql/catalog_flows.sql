-- Every flow's settings, as a replica's catalog holds them (src/catalog.rs):
-- read as often as catalog_quotas.sql, so it reads only what a decision uses
-- and in no order (list_flows.sql sorts by name for the admin API). At 3,000
-- flows: 0.4 ms, where list_flows.sql took 2.3-3.8 ms.
SELECT name, quota, further_quotas, mode, priority, enforce_percent
FROM flow
