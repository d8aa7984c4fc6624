-- Create or update a flow. A NULL mode, priority or enforce_percent keeps the
-- stored value (or the column default for a new flow): a flow created without a
-- mode observes. enforce_percent = 100 is stored as NULL (the whole share).
INSERT INTO flow AS f (name, quota, mode, priority, enforce_percent)
VALUES ($1, $2, coalesce($3, 'observe'), coalesce($4::smallint, 2::smallint), nullif($5::smallint, 100))
ON CONFLICT (name) DO UPDATE
    SET quota           = EXCLUDED.quota,
        mode            = coalesce($3, f.mode),
        priority        = coalesce($4::smallint, f.priority),
        enforce_percent = CASE WHEN $5::smallint IS NULL THEN f.enforce_percent
                               ELSE nullif($5::smallint, 100) END,
        updated_at      = arbiter_now()
RETURNING name, quota, mode, priority, enforce_percent, created_at, updated_at
