-- Functions and views (sql/functions/, sql/views/) are applied in
-- transactions that hold this lock, so replicas that start at once take turns:
-- two CREATE OR REPLACE of one function at once fail ("tuple concurrently
-- updated"), and a view dropped by one would be missing for the other.
-- Key space 1936813167 ("sqlo"), key 0; transaction-scoped.
SELECT pg_advisory_xact_lock(1936813167, 0);
