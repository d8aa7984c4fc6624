-- Create a flow or replace its settings: the caller resolved and checked
-- every field (a PATCH merged it with the stored row first). $7: the
-- quotas it spends after $2, in order.
INSERT INTO flow AS f (name, quota, mode, priority, enforce_percent, fallback, further_quotas)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name) DO UPDATE
    SET quota           = EXCLUDED.quota,
        further_quotas  = EXCLUDED.further_quotas,
        mode            = EXCLUDED.mode,
        priority        = EXCLUDED.priority,
        enforce_percent = EXCLUDED.enforce_percent,
        fallback        = EXCLUDED.fallback,
        updated_at      = arbiter_now()
RETURNING name, quota, array_prepend(quota, further_quotas) AS "quotas!", mode, priority,
          enforce_percent, fallback, created_at, updated_at
