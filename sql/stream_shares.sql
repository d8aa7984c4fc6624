-- The quotas the given flows spend: hourly ceiling (NULL without an hour),
-- every window (parallel arrays), effective cadence
-- (adaptive factor applied, NULL without cadence), live share-stream clients
-- across replicas (heartbeat within 3 s), each client once per quota, and
-- which of the given flows spend it (first or further) with their
-- fallback, by flow name.
SELECT q.name AS "quota!",
       q.hourly_ceiling,
       coalesce((SELECT array_agg(p.period) FROM quota_period p WHERE p.quota = q.name), '{}') AS "periods!",
       coalesce((SELECT array_agg(p.ceiling) FROM quota_period p WHERE p.quota = q.name), '{}') AS "ceilings!",
       coalesce((SELECT array_agg(p.zone) FROM quota_period p WHERE p.quota = q.name), '{}') AS "zones!: Vec<Option<String>>",
       c.effective_rate,
       c.effective_burst,
       (SELECT count(DISTINCT s.id)
        FROM stream_client s
        JOIN flow sf ON sf.name = ANY (s.flows)
        WHERE (sf.quota = q.name OR q.name = ANY (sf.further_quotas))
          AND s.seen_at > arbiter_now() - interval '3 seconds') AS "clients!",
       (SELECT array_agg(f.name ORDER BY f.name)
        FROM flow f
        WHERE (f.quota = q.name OR q.name = ANY (f.further_quotas)) AND f.name = ANY ($1)) AS "flows!",
       (SELECT array_agg(f.fallback ORDER BY f.name)
        FROM flow f
        WHERE (f.quota = q.name OR q.name = ANY (f.further_quotas)) AND f.name = ANY ($1)) AS "fallbacks!"
FROM quota q
LEFT JOIN quota_cadence c ON c.quota = q.name
WHERE q.name IN (SELECT f.quota FROM flow f WHERE f.name = ANY ($1)
                 UNION ALL
                 SELECT unnest(f.further_quotas) FROM flow f WHERE f.name = ANY ($1))
ORDER BY q.name
