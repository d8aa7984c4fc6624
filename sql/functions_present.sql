-- The functions of the current schema, by name: store::migrate creates the
-- ones of sql/functions/ still missing before the migrations run (their column
-- defaults and triggers call them).
SELECT p.proname::text AS "name!"
FROM pg_proc p
WHERE p.pronamespace = to_regnamespace(current_schema())
