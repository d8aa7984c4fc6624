-- Who changed the catalog, for its audit trail (catalog_audit.actor): what the
-- API or CLI declared for its transaction (SET LOCAL quota_arbiter.actor),
-- else the database role (raw SQL).
CREATE OR REPLACE FUNCTION catalog_actor() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('quota_arbiter.actor', true), ''), 'sql:' || session_user)
$$;
