-- Create a flow or replace its settings: the caller resolved and checked
-- every field (a PATCH merged it with the stored row first).
INSERT INTO flow AS f (name, quota, mode, priority, enforce_percent, fallback)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO UPDATE
    SET quota           = EXCLUDED.quota,
        mode            = EXCLUDED.mode,
        priority        = EXCLUDED.priority,
        enforce_percent = EXCLUDED.enforce_percent,
        fallback        = EXCLUDED.fallback,
        updated_at      = arbiter_now()
RETURNING name, quota, mode, priority, enforce_percent, fallback, created_at, updated_at
