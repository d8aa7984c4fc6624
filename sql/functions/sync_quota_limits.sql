-- The trigger function of quota (its trigger is in migrations/): keep the
-- bucket and the in-flight places in step with the quota's settings.
CREATE OR REPLACE FUNCTION sync_quota_limits() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.rate IS NULL THEN
        DELETE FROM quota_bucket WHERE quota = NEW.name;
    ELSE
        -- A new bucket starts full; an existing one keeps its tokens (capped by
        -- the new burst when it is read), so a settings change grants no burst.
        INSERT INTO quota_bucket (quota, tokens, refilled_at, factor_at)
        VALUES (NEW.name, NEW.burst, arbiter_now(), arbiter_now())
        ON CONFLICT (quota) DO NOTHING;
    END IF;
    DELETE FROM quota_place WHERE quota = NEW.name AND place > coalesce(NEW.max_in_flight, 0);
    INSERT INTO quota_place (quota, place)
    SELECT NEW.name, p FROM generate_series(1, coalesce(NEW.max_in_flight, 0)) p
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
