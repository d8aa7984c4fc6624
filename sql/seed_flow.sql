-- Seed a flow declared in the config file. Never overwrites what the table
-- holds, above all a mode flipped at run time. $6: the quotas it spends
-- after $2. Returns the stored mode.
WITH inserted AS (
    INSERT INTO flow (name, quota, mode, priority, fallback, further_quotas)
    VALUES ($1, $2, coalesce($3, 'observe'), coalesce($4::smallint, 2::smallint),
            coalesce($5, 'off'), $6)
    ON CONFLICT (name) DO NOTHING
    RETURNING mode
)
SELECT coalesce((SELECT mode FROM inserted),
                (SELECT mode FROM flow WHERE name = $1)) AS "mode!"
