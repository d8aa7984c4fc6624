-- The trigger function of quota, quota_period, flow and route_class (their
-- triggers are in migrations/): every change to a catalog entry, recorded by
-- the database itself, whoever made it, and announced to every replica.
-- Audits every column that changed, except bookkeeping ones, so settings
-- added by later migrations are covered without touching this function. A
-- quota's window is one field of the quota, `window PERIOD`, its value
-- `ceiling` or `ceiling@zone`; its `1h` window is the quota's own
-- `hourly_ceiling` field (window_to_quota_hour() keeps the two equal), so
-- an hour's change is recorded once, as it always was.
CREATE OR REPLACE FUNCTION audit_catalog_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_fields jsonb := CASE WHEN TG_OP = 'INSERT' THEN '{}'::jsonb ELSE to_jsonb(OLD) END;
    new_fields jsonb := CASE WHEN TG_OP = 'DELETE' THEN '{}'::jsonb ELSE to_jsonb(NEW) END;
    entity_name text := coalesce(new_fields ->> 'name', old_fields ->> 'name');
    field text;
BEGIN
    IF TG_TABLE_NAME = 'quota_period' THEN
        entity_name := coalesce(new_fields ->> 'quota', old_fields ->> 'quota');
        IF coalesce(new_fields ->> 'period', old_fields ->> 'period') = '1h' THEN
            RETURN NULL;
        END IF;
        INSERT INTO catalog_audit (actor, entity, name, field, from_value, to_value)
        VALUES (catalog_actor(), 'quota', entity_name,
                'window ' || coalesce(new_fields ->> 'period', old_fields ->> 'period'),
                (old_fields ->> 'ceiling') || coalesce('@' || (old_fields ->> 'zone'), ''),
                (new_fields ->> 'ceiling') || coalesce('@' || (new_fields ->> 'zone'), ''));
        PERFORM pg_notify('quota_arbiter_catalog', 'quota:' || entity_name);
        RETURN NULL;
    END IF;
    FOR field IN
        SELECT key FROM jsonb_object_keys(old_fields || new_fields) AS key
        WHERE key NOT IN ('name', 'created_at', 'updated_at')
        ORDER BY key
    LOOP
        IF (old_fields ->> field) IS DISTINCT FROM (new_fields ->> field) THEN
            INSERT INTO catalog_audit (actor, entity, name, field, from_value, to_value)
            VALUES (catalog_actor(), TG_TABLE_NAME, entity_name, field,
                    old_fields ->> field, new_fields ->> field);
        END IF;
    END LOOP;
    -- Replicas LISTEN on this channel and reload the catalog at once.
    PERFORM pg_notify('quota_arbiter_catalog', TG_TABLE_NAME || ':' || entity_name);
    RETURN NULL;
END
$$;
