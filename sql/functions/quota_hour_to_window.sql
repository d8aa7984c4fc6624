-- The trigger function of quota's hourly_ceiling (its trigger is in
-- migrations/): the quota's `1h` window follows it, so SQL that writes
-- `hourly_ceiling` (INSERT INTO quota (name, hourly_ceiling) …, UPDATE quota
-- SET hourly_ceiling = …) keeps working; NULL removes the hour. The windows
-- (quota_period) are what decisions read; window_to_quota_hour() keeps the
-- column equal to them the other way.
CREATE OR REPLACE FUNCTION quota_hour_to_window() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.hourly_ceiling IS NULL THEN
        DELETE FROM quota_period WHERE quota = NEW.name AND period = '1h';
    ELSE
        INSERT INTO quota_period AS p (quota, period, ceiling)
        VALUES (NEW.name, '1h', NEW.hourly_ceiling)
        ON CONFLICT (quota, period) DO UPDATE
            SET ceiling = EXCLUDED.ceiling
            WHERE p.ceiling IS DISTINCT FROM EXCLUDED.ceiling;
    END IF;
    RETURN NULL;
END
$$;
