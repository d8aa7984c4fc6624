-- Of the time zones $1, those PostgreSQL does not know (its zone names are
-- the service's: no second copy of the time-zone database).
SELECT z AS "zone!"
FROM unnest($1::text[]) AS z
WHERE z NOT IN (SELECT name FROM pg_timezone_names)
