-- Create a quota or replace its settings: the caller resolved and checked
-- every field (a PATCH merged it with the stored row first). Its windows are
-- put_quota_windows.sql, in the same transaction.
INSERT INTO quota AS q (name, rate, burst, adaptive, max_in_flight, priority2_share, priority3_share)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name) DO UPDATE
    SET rate            = EXCLUDED.rate,
        burst           = EXCLUDED.burst,
        adaptive        = EXCLUDED.adaptive,
        max_in_flight   = EXCLUDED.max_in_flight,
        priority2_share = EXCLUDED.priority2_share,
        priority3_share = EXCLUDED.priority3_share,
        updated_at      = arbiter_now()
