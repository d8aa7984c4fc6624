-- When the first live lease of quota $1 expires (NULL: none is live), with
-- the database clock: what a deferral by the in-flight places waits for
-- (the rule is Deferral::by, src/domain/decision.rs).
SELECT (SELECT min(valid_until) FROM quota_place WHERE quota = $1) AS "first_lease_expiry?",
       arbiter_now()                  AS "db_now!",
       window_start_of(arbiter_now()) AS "window_start!",
       window_end_of(arbiter_now()) AS "window_end!"
