-- The state a reader sees: a claim whose lease ran out is pending again (the
-- claims already treat it so), as in the views.
CREATE OR REPLACE FUNCTION work_state_now(state text, lease_until timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN state = 'claimed' AND lease_until < arbiter_now() THEN 'pending' ELSE state END
$$;
