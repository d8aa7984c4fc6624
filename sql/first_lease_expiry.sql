-- When the first lease of quota $1 expires: the earliest a quota whose every
-- in-flight place is leased can
-- have room again (a report may free one sooner), with the database clock.
SELECT (SELECT min(valid_until) FROM quota_place WHERE quota = $1) AS "retry_at?",
       arbiter_now()                  AS "db_now!",
       window_start_of(arbiter_now()) AS "window_start!",
       window_end_of(arbiter_now())   AS "window_end!"
