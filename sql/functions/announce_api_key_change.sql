-- The trigger function of api_key (its trigger is in migrations/): a created
-- or revoked key reaches every replica the way a flag flip does, on the
-- channel they already LISTEN on.
CREATE OR REPLACE FUNCTION announce_api_key_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('quota_arbiter_catalog', 'api_key:' || coalesce(NEW.id, OLD.id));
    RETURN NULL;
END
$$;
