-- A quota's stored settings, locked until the patch that read them commits
-- (its windows are written by the same transaction, after this lock).
SELECT q.rate, q.burst, q.adaptive, q.max_in_flight, q.priority2_share, q.priority3_share,
       coalesce((SELECT array_agg(p.period) FROM quota_period p WHERE p.quota = q.name), '{}') AS "periods!",
       coalesce((SELECT array_agg(p.ceiling) FROM quota_period p WHERE p.quota = q.name), '{}') AS "ceilings!",
       coalesce((SELECT array_agg(p.zone) FROM quota_period p WHERE p.quota = q.name), '{}') AS "zones!: Vec<Option<String>>"
FROM quota q
WHERE q.name = $1
FOR UPDATE
