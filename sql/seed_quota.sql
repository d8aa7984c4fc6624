-- Seed a quota declared in the config file. Never overwrites what the table
-- holds: run-time changes win. Returns the stored ceiling so drift can be logged.
WITH inserted AS (
    INSERT INTO quota (name, hourly_ceiling, rate, burst, adaptive, max_in_flight,
                       priority2_share, priority3_share)
    VALUES ($1, $2, $3, $4, coalesce($5, true), $6, $7, $8)
    ON CONFLICT (name) DO NOTHING
    RETURNING hourly_ceiling
)
SELECT coalesce((SELECT hourly_ceiling FROM inserted),
                (SELECT hourly_ceiling FROM quota WHERE name = $1)) AS "hourly_ceiling!"
