-- The revision of the functions and views in place (none before the first
-- migrate that applied them); read under the objects' lock.
SELECT revision FROM sql_objects
