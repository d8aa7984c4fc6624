-- Create a quota or change only its ceiling (the CLI's `quota NAME --hourly-ceiling N`).
INSERT INTO quota AS q (name, hourly_ceiling)
VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE
    SET hourly_ceiling = EXCLUDED.hourly_ceiling,
        updated_at = CASE WHEN q.hourly_ceiling IS DISTINCT FROM EXCLUDED.hourly_ceiling
                          THEN arbiter_now() ELSE q.updated_at END
RETURNING name, hourly_ceiling
