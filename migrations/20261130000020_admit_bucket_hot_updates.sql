-- Caller buckets are written on every admission; with ten thousand callers
-- each admission rewrites a row of its own. Two costs that were not the
-- decision's own (design.md §11):
--
-- 1. The index on full_at made every bucket update a non-HOT update: each
--    wrote a new entry in both indexes. Pruning, its only reader, runs once a
--    minute and may scan the table; the hot path then updates in place
--    (HOT), with room left on each page for the new row versions.
DROP INDEX admit_bucket_full_at;
ALTER TABLE admit_bucket SET (fillfactor = 50);

-- 2. admit_callers() keeps its statements' plans for the life of the
--    connection, planned while the table may still be nearly empty: a plan
--    that reads the whole table for a group's keys stays with a table of ten
--    thousand rows. The function only ever reaches buckets and window rows
--    by key, so it never plans a sequential scan.
ALTER FUNCTION admit_callers(bytea[], text[], text, double precision, double precision, bigint, bigint, integer)
    SET enable_seqscan = off;
