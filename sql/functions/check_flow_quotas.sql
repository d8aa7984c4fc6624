-- The BEFORE trigger function of flow's quotas and of quota deletions (its
-- triggers are in migrations/): a flow's further quotas are existing
-- quotas, none named twice nor the flow's first (`quota`), and a quota a
-- flow spends among its further ones is not deleted (its first is held by
-- the foreign key). Raw SQL thus cannot make a flow that spends a quota
-- twice in one call, or one that does not exist; the API and the CLI say
-- the same before writing.
CREATE OR REPLACE FUNCTION check_flow_quotas() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'quota' THEN
        IF EXISTS (SELECT 1 FROM flow WHERE OLD.name = ANY (further_quotas)) THEN
            RAISE EXCEPTION 'quota % is spent by a flow', OLD.name
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN OLD;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(NEW.further_quotas) AS q
               WHERE q IS NULL OR q = NEW.quota)
       OR cardinality(NEW.further_quotas)
          <> (SELECT count(DISTINCT q) FROM unnest(NEW.further_quotas) AS q) THEN
        RAISE EXCEPTION 'flow % names a quota twice', NEW.name
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(NEW.further_quotas) AS q
               WHERE NOT EXISTS (SELECT 1 FROM quota WHERE name = q)) THEN
        RAISE EXCEPTION 'flow % names a quota that does not exist', NEW.name
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NEW;
END
$$;
