-- The quotas the given flows spend: effective cadence (adaptive factor
-- applied, NULL without cadence) and live share-stream clients across
-- replicas (heartbeat within 3 s), each client once per quota.
SELECT q.name AS "quota!",
       c.effective_rate,
       c.effective_burst,
       (SELECT count(DISTINCT s.id)
        FROM stream_client s
        JOIN flow sf ON sf.name = ANY (s.flows)
        WHERE sf.quota = q.name
          AND s.seen_at > arbiter_now() - interval '3 seconds') AS "clients!"
FROM quota q
LEFT JOIN quota_cadence c ON c.quota = q.name
WHERE q.name IN (SELECT f.quota FROM flow f WHERE f.name = ANY ($1))
ORDER BY q.name
