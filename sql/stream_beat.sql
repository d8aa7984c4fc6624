-- A share stream's heartbeat (the row comes back if a prune took it during
-- an outage); rows a minute stale are clients long gone.
WITH pruned AS (
    DELETE FROM stream_client WHERE seen_at < arbiter_now() - interval '1 minute'
)
INSERT INTO stream_client (id, flows, seen_at) VALUES ($1, $2, arbiter_now())
ON CONFLICT (id) DO UPDATE SET seen_at = arbiter_now()
