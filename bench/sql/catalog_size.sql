-- How many quotas the service's catalog holds (this run's and any earlier
-- run's): the run prints it, since a replica keeps the whole catalog in memory.
SELECT count(*) AS "quotas!" FROM quota
