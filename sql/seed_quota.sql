-- Seed a quota declared in the config file, with its windows (periods $8,
-- ceilings $9, zones $10). Never overwrites what the tables hold: run-time
-- changes win. Returns the stored windows as `period=ceiling[@zone]`,
-- shortest first, so that drift can be logged.
WITH inserted AS (
    INSERT INTO quota (name, rate, burst, adaptive, max_in_flight, priority2_share, priority3_share)
    VALUES ($1, $2, $3, coalesce($4, true), $5, $6, $7)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
), windows AS (
    INSERT INTO quota_period (quota, period, ceiling, zone)
    SELECT i.name, g.period, g.ceiling, g.zone
    FROM inserted i, unnest($8::text[], $9::bigint[], $10::text[]) AS g (period, ceiling, zone)
    RETURNING period, ceiling, zone
), stored AS (
    SELECT period, ceiling, zone FROM windows
    UNION ALL
    SELECT period, ceiling, zone FROM quota_period
    WHERE quota = $1 AND NOT EXISTS (SELECT 1 FROM inserted)
)
SELECT coalesce(array_agg(period || '=' || ceiling || coalesce('@' || zone, '')
                          ORDER BY coalesce(period_seconds(period), 9999999999)), '{}') AS "windows!"
FROM stored
