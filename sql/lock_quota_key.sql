-- Whether quota $1 exists, held so that it cannot be deleted before the flow
-- that names it commits.
SELECT name FROM quota WHERE name = $1 FOR KEY SHARE
