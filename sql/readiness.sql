-- Ready when the store answers and every migration this build knows is applied.
SELECT count(*) AS "applied!"
FROM _sqlx_migrations
WHERE success
