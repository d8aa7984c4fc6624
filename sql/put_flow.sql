-- Create or update a flow. A NULL mode or priority keeps the stored value
-- (or the column default for a new flow): a flow created without a mode observes.
INSERT INTO flow AS f (name, quota, mode, priority)
VALUES ($1, $2, coalesce($3, 'observe'), coalesce($4::smallint, 2::smallint))
ON CONFLICT (name) DO UPDATE
    SET quota      = EXCLUDED.quota,
        mode       = coalesce($3, f.mode),
        priority   = coalesce($4::smallint, f.priority),
        updated_at = arbiter_now()
RETURNING name, quota, mode, priority, created_at, updated_at
