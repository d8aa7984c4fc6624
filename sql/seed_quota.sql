-- Seed a quota declared in the config file. Never overwrites what the table
-- holds: run-time changes win. Returns the stored ceiling so drift can be logged.
WITH inserted AS (
    INSERT INTO quota (name, hourly_ceiling)
    VALUES ($1, $2)
    ON CONFLICT (name) DO NOTHING
    RETURNING hourly_ceiling
)
SELECT coalesce((SELECT hourly_ceiling FROM inserted),
                (SELECT hourly_ceiling FROM quota WHERE name = $1)) AS "hourly_ceiling!"
