-- When the first live lease of quota $1 expires (NULL: none is live), and
-- how long its flows typically hold a place (their average hold time,
-- seconds; NULL: no history), with the database clock: what a deferral by
-- the in-flight places waits for (the rule is Deferral::by,
-- src/domain/decision.rs).
SELECT (SELECT min(valid_until) FROM quota_place WHERE quota = $1) AS "first_lease_expiry?",
       (SELECT avg(d.avg_seconds) FROM flow f
        JOIN flow_lease_duration d ON d.flow = f.name
        WHERE f.quota = $1)          AS "typical_hold?",
       arbiter_now()                  AS "db_now!",
       window_start_of(arbiter_now()) AS "window_start!",
       window_end_of(arbiter_now())   AS "window_end!"
