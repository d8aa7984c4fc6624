-- The trigger function of quota, flow and route_class (their triggers are in
-- migrations/): every change to a catalog entry, recorded by the database
-- itself, whoever made it, and announced to every replica.
-- Audits every column that changed, except bookkeeping ones, so settings
-- added by later migrations are covered without touching this function.
CREATE OR REPLACE FUNCTION audit_catalog_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_fields jsonb := CASE WHEN TG_OP = 'INSERT' THEN '{}'::jsonb ELSE to_jsonb(OLD) END;
    new_fields jsonb := CASE WHEN TG_OP = 'DELETE' THEN '{}'::jsonb ELSE to_jsonb(NEW) END;
    entity_name text := coalesce(new_fields ->> 'name', old_fields ->> 'name');
    field text;
BEGIN
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
