-- Keys for the arbiter's own API (design.md §4): who may call what. Only a
-- hash of each key is kept; the key itself is shown once, when created.
CREATE TABLE api_key (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text,
    role        text NOT NULL CHECK (role IN ('worker', 'operator', 'admin')),
    tenant      text,
    hash        bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT arbiter_now(),
    revoked_at  timestamptz
);

-- A created or revoked key reaches every replica the way a flag flip does:
-- on the channel they already LISTEN on.
CREATE FUNCTION announce_api_key_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('quota_arbiter_catalog', 'api_key:' || coalesce(NEW.id, OLD.id));
    RETURN NULL;
END
$$;

CREATE TRIGGER api_key_announce AFTER INSERT OR UPDATE OR DELETE ON api_key
    FOR EACH ROW EXECUTE FUNCTION announce_api_key_change();

-- Which key took a concurrency lease, so that only that key (or an admin)
-- frees it. Kept beside `quota_place` rather than in it: the decision path
-- stays as it is, and a row outlives its lease (60 s at most) only until
-- the pruning task removes it.
CREATE TABLE lease_holder (
    lease_id    bigint PRIMARY KEY,
    key_id      bigint NOT NULL REFERENCES api_key (id) ON DELETE CASCADE,
    taken_at    timestamptz NOT NULL DEFAULT arbiter_now()
);
CREATE INDEX lease_holder_taken_at ON lease_holder (taken_at);
