-- Flip an existing flow's mode (and optionally its enforce_percent; 100 = all).
UPDATE flow
SET mode = $2,
    enforce_percent = CASE WHEN $3::smallint IS NULL THEN enforce_percent ELSE nullif($3::smallint, 100) END,
    updated_at = arbiter_now()
WHERE name = $1
RETURNING name, quota, mode, priority, enforce_percent, created_at, updated_at
