-- The database clock and the UTC hour it is in (decisions are tallied per hour), for replicas that need an
-- estimate of database time while the store is out of reach.
SELECT arbiter_now()                  AS "db_now!",
       window_start_of(arbiter_now()) AS "window_start!",
       window_end_of(arbiter_now()) AS "window_end!"
