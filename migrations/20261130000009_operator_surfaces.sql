-- One meaning on every surface. The API and the CLI refuse an enforce percent
-- outside enforce mode; raw SQL cannot be refused without breaking the plain
-- rollback (`UPDATE flow SET mode = 'observe'`), so the table drops the
-- percent itself whenever a flow leaves enforce mode, and stores 100 % as
-- NULL (all) as the API does. A flow flipped back to enforce later is then
-- enforced fully, never at a percent left over from an earlier rollout.
CREATE FUNCTION normalize_enforce_percent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.mode <> 'enforce' OR NEW.enforce_percent = 100 THEN
        NEW.enforce_percent := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER flow_enforce_percent BEFORE INSERT OR UPDATE ON flow
    FOR EACH ROW EXECUTE FUNCTION normalize_enforce_percent();

UPDATE flow SET enforce_percent = NULL
WHERE enforce_percent IS NOT NULL AND (mode <> 'enforce' OR enforce_percent = 100);
