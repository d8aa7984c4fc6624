-- Operating the arbiter: audited flag flips announced to every replica,
-- gradual enforcement, and views an operator can query with one SELECT.

-- Gradual rollout: an enforced flow with enforce_percent < 100 defers only that
-- share of its over-ceiling decisions (deterministic per `ref`); the rest are
-- granted as observed. NULL means 100.
ALTER TABLE flow ADD COLUMN enforce_percent smallint
    CHECK (enforce_percent BETWEEN 1 AND 100);

-- Observe-mode decisions over the ceiling that carried a deadline.
ALTER TABLE decision_tally ADD COLUMN would_defer_with_deadline bigint NOT NULL DEFAULT 0;

-- Every change to a quota or flow, recorded by the database itself, whoever
-- made it. `actor` is what the API or CLI declared for its transaction
-- (SET LOCAL quota_arbiter.actor), else the database role (raw SQL).
CREATE TABLE catalog_audit (
    id         bigserial PRIMARY KEY,
    changed_at timestamptz NOT NULL DEFAULT arbiter_now(),
    actor      text NOT NULL,
    entity     text NOT NULL CHECK (entity IN ('quota', 'flow')),
    name       text NOT NULL,
    field      text NOT NULL,
    from_value text,
    to_value   text
);

CREATE INDEX catalog_audit_name_idx ON catalog_audit (entity, name, changed_at DESC);

CREATE FUNCTION catalog_actor() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('quota_arbiter.actor', true), ''), 'sql:' || session_user)
$$;

-- Audits every column that changed, except bookkeeping ones, so settings
-- added by later migrations are covered without touching this function.
CREATE FUNCTION audit_catalog_change() RETURNS trigger
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

CREATE TRIGGER quota_audit AFTER INSERT OR UPDATE OR DELETE ON quota
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();
CREATE TRIGGER flow_audit AFTER INSERT OR UPDATE OR DELETE ON flow
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();

-- Current usage per quota: count, ceiling, percent used, seconds left in the window.
CREATE VIEW quota_usage AS
SELECT q.name                                   AS quota,
       window_start_of(arbiter_now())           AS window_start,
       coalesce(w.count, 0)                     AS count,
       q.hourly_ceiling,
       CASE WHEN q.hourly_ceiling > 0
            THEN round(100.0 * coalesce(w.count, 0) / q.hourly_ceiling, 1) END AS percent_used,
       greatest(0, q.hourly_ceiling - coalesce(w.count, 0)) AS slots_left,
       ceil(extract(epoch FROM window_end_of(arbiter_now()) - arbiter_now()))::int AS seconds_left
FROM quota q
LEFT JOIN quota_window w ON w.quota = q.name AND w.window_start = window_start_of(arbiter_now());

-- The last 24 windows per quota with decision tallies by outcome.
CREATE VIEW quota_recent_windows AS
SELECT w.quota, w.window_start, w.count, q.hourly_ceiling,
       w.count > q.hourly_ceiling AS over_ceiling,
       coalesce(sum(d.granted), 0)::bigint     AS granted,
       coalesce(sum(d.deferred), 0)::bigint    AS deferred,
       coalesce(sum(d.would_defer), 0)::bigint AS would_defer,
       coalesce(sum(d.bypassed), 0)::bigint    AS bypassed,
       coalesce(sum(d.unthrottled), 0)::bigint AS unthrottled
FROM quota_window w
JOIN quota q ON q.name = w.quota
LEFT JOIN decision_tally d ON d.quota = w.quota AND d.window_start = w.window_start
WHERE w.window_start > window_start_of(arbiter_now()) - interval '24 hours'
GROUP BY w.quota, w.window_start, w.count, q.hourly_ceiling;

-- Per flow and hour: decisions that enforcement would have deferred, for flows
-- that are still in observe mode.
CREATE VIEW observe_would_defer AS
SELECT d.flow, d.quota, d.window_start,
       sum(d.granted)::bigint                   AS decisions,
       sum(d.would_defer)::bigint               AS would_defer,
       sum(d.would_defer_with_deadline)::bigint AS would_defer_with_deadline
FROM decision_tally d
JOIN flow f ON f.name = d.flow AND f.mode = 'observe'
GROUP BY d.flow, d.quota, d.window_start;

-- Deadline bypasses per hour and flow.
CREATE VIEW bypasses_by_hour AS
SELECT d.window_start, d.quota, d.flow, sum(d.bypassed)::bigint AS bypassed
FROM decision_tally d
WHERE d.bypassed > 0
GROUP BY d.window_start, d.quota, d.flow;
