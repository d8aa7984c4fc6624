-- The flows that spend quota $1 together with other quotas in one call: a
-- quota they spend keeps to windows alone (no cadence, no in-flight places).
SELECT name
FROM flow
WHERE cardinality(further_quotas) > 0 AND ($1 = quota OR $1 = ANY (further_quotas))
ORDER BY name
