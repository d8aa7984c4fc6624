-- Ready when the store answers and every migration this build knows ($1: their
-- versions) is applied; a database migrated further by a newer build is ready
-- too.
SELECT count(*) AS "applied!"
FROM _sqlx_migrations
WHERE success AND version = ANY($1::bigint[])
