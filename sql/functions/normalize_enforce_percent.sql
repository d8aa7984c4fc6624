-- The BEFORE trigger function of flow (its trigger is in migrations/). One
-- meaning on every surface. The API and the CLI refuse an enforce percent
-- outside enforce mode; raw SQL cannot be refused without breaking the plain
-- rollback (`UPDATE flow SET mode = 'observe'`), so the table drops the
-- percent itself whenever a flow leaves enforce mode, and stores 100 % as
-- NULL (all) as the API does. A flow flipped back to enforce later is then
-- enforced fully, never at a percent left over from an earlier rollout.
CREATE OR REPLACE FUNCTION normalize_enforce_percent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.mode <> 'enforce' OR NEW.enforce_percent = 100 THEN
        NEW.enforce_percent := NULL;
    END IF;
    RETURN NEW;
END
$$;
