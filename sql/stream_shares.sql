-- The quotas the given flows spend: hourly ceiling (NULL without an hour),
-- every window (parallel arrays, shortest first: period, ceiling, what the
-- current window has left and when it ends), configured and effective
-- cadence (adaptive factor applied; NULL without cadence), live share-stream
-- clients across replicas (heartbeat within 3 s), each client once per
-- quota, and which of the given flows spend it (first or further) with their
-- fallback, by flow name. A client's local fallback spends within what each
-- window has left (docs/design.md §12).
SELECT q.name AS "quota!",
       arbiter_now() AS "db_now!",
       q.hourly_ceiling,
       coalesce(w.periods, '{}') AS "periods!",
       coalesce(w.ceilings, '{}') AS "ceilings!",
       coalesce(w.lefts, '{}') AS "lefts!",
       coalesce(w.ends, '{}') AS "ends!",
       c.rate AS configured_rate,
       c.burst AS configured_burst,
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
LEFT JOIN quota_cadence c ON c.quota = q.name AND c.rate IS NOT NULL
CROSS JOIN LATERAL (
    SELECT array_agg(p.period ORDER BY period_seconds(p.period) NULLS LAST) AS periods,
           array_agg(p.ceiling ORDER BY period_seconds(p.period) NULLS LAST) AS ceilings,
           array_agg(greatest(0, p.ceiling - coalesce(n.count, 0))
                     ORDER BY period_seconds(p.period) NULLS LAST) AS lefts,
           array_agg(window_end_of(arbiter_now(), p.period, p.zone)
                     ORDER BY period_seconds(p.period) NULLS LAST) AS ends
    FROM quota_period p
    LEFT JOIN quota_window n
           ON n.quota = p.quota AND n.period = p.period
          AND n.window_start = window_start_of(arbiter_now(), p.period, p.zone)
    WHERE p.quota = q.name
) w
WHERE q.name IN (SELECT f.quota FROM flow f WHERE f.name = ANY ($1)
                 UNION ALL
                 SELECT unnest(f.further_quotas) FROM flow f WHERE f.name = ANY ($1))
ORDER BY q.name
