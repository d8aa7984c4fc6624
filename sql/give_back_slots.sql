-- Give back $3 slots that a take-up-to-k upsert took from window $2 of quota
-- $1 but that no item could use. Only ever decrements, and never below what
-- the same caller added.
UPDATE quota_window
SET count = count - $3::bigint
WHERE quota = $1 AND window_start = $2 AND count >= $3::bigint
