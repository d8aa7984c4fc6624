-- Connected share streams (GET /v1/stream, design.md §10): one
-- row per connected client on any replica, its heartbeat renewed every
-- second. A quota's live clients are the rows seen within the last 3 s whose
-- flows spend it; a client gone without a goodbye stops counting then.
-- UNLOGGED: presence only, nothing to recover after a crash.
CREATE UNLOGGED TABLE stream_client (
    id      bigserial PRIMARY KEY,
    flows   text[] NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT arbiter_now()
);
