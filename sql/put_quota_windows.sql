-- Quota $1's windows become exactly periods $2 with ceilings $3 and zones
-- $4: the others go, the given ones are written where they changed (the
-- audit trigger records each change as `window PERIOD`).
WITH gone AS (
    DELETE FROM quota_period p
    WHERE p.quota = $1 AND p.period <> ALL ($2::text[])
)
INSERT INTO quota_period AS p (quota, period, ceiling, zone)
SELECT $1, g.period, g.ceiling, g.zone
FROM unnest($2::text[], $3::bigint[], $4::text[]) AS g (period, ceiling, zone)
ON CONFLICT (quota, period) DO UPDATE
    SET ceiling = EXCLUDED.ceiling, zone = EXCLUDED.zone
    WHERE (p.ceiling, p.zone) IS DISTINCT FROM (EXCLUDED.ceiling, EXCLUDED.zone)
