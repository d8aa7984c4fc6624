-- Delete route class $1 and its admission counts (ON DELETE CASCADE). Its
-- callers' buckets carry no class name; idle, they are pruned.
DELETE FROM route_class WHERE name = $1
