-- Admission counts of windows that ended more than $1 seconds ago (windows
-- last an hour at most), a batch of $2 at a time: the tenants' first, then
-- the classes'.
WITH tenants AS (
    DELETE FROM admit_tenant_window
    WHERE (route_class, tenant, window_start) IN (
        SELECT route_class, tenant, window_start FROM admit_tenant_window
        WHERE window_start < arbiter_now() - make_interval(secs => $1::float8 + 3600)
        ORDER BY window_start
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
), classes AS (
    DELETE FROM admit_window
    WHERE (route_class, window_start) IN (
        SELECT route_class, window_start FROM admit_window
        WHERE window_start < arbiter_now() - make_interval(secs => $1::float8 + 3600)
        ORDER BY window_start
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT (SELECT count(*) FROM tenants) + (SELECT count(*) FROM classes) AS "pruned!"
