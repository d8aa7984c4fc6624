-- The trigger function of quota_period (its trigger is in migrations/): a
-- quota's `1h` window written (by the API, the CLI, a seed or SQL) shows in
-- quota.hourly_ceiling, which is NULL when the quota has no hour. Only a
-- change writes: quota_hour_to_window() writes back only a change too, so
-- the two triggers stop after one round.
CREATE OR REPLACE FUNCTION window_to_quota_hour() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed quota_period := coalesce(NEW, OLD);
BEGIN
    IF changed.period = '1h' THEN
        UPDATE quota
        SET hourly_ceiling = CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.ceiling END
        WHERE name = changed.quota
          AND hourly_ceiling IS DISTINCT FROM CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.ceiling END;
    END IF;
    RETURN NULL;
END
$$;
