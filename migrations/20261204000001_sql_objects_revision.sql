-- Which revision of sql/functions/ and sql/views/ the database holds
-- (OBJECTS_REVISION in src/store/bootstrap.rs). A migrate re-applies its
-- build's functions and views only over the same or an older revision, so
-- an older replica restarted during a rolling upgrade cannot put back the
-- bodies the newer release replaced.
CREATE TABLE sql_objects (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revision integer NOT NULL CHECK (revision >= 1),
    applied_at timestamptz NOT NULL DEFAULT arbiter_now()
);
