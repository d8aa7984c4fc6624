-- One word, one meaning: a "slot" is a unit of a quota's hourly budget
-- (quota_window.count); one of a quota's max_in_flight concurrent emissions is
-- a "place", held by a lease. Views keep working across the rename (they are
-- bound to the table, not its name); the trigger function is rewritten.
ALTER TABLE quota_slot RENAME TO quota_place;
ALTER TABLE quota_place RENAME COLUMN slot TO place;
ALTER TABLE quota_place RENAME CONSTRAINT quota_slot_pkey TO quota_place_pkey;
ALTER TABLE quota_place RENAME CONSTRAINT quota_slot_lease_id_key TO quota_place_lease_id_key;
ALTER TABLE quota_place RENAME CONSTRAINT quota_slot_quota_fkey TO quota_place_quota_fkey;
ALTER TABLE work_item RENAME COLUMN slot_lease_id TO place_lease_id;

-- Keep the bucket and the in-flight places in step with the quota's settings.
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
