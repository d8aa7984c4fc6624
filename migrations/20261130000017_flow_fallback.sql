-- A flow's fallback (design.md §12): what a worker's client does for it when
-- the arbiter is unreachable. 'off' (the default): the call fails, as before.
-- 'local': the client decides locally at its last known share of the quota
-- (GET /v1/stream), waits rather than refuses, and reports the slots it
-- spent that way once the arbiter answers again.
ALTER TABLE flow ADD COLUMN fallback text NOT NULL DEFAULT 'off'
    CHECK (fallback IN ('off', 'local'));
