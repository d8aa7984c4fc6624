-- Pending work (claims whose lease ran out included) by flow and deadline bucket.
CREATE OR REPLACE VIEW work_pending_by_flow AS
SELECT flow,
       bucket.rank AS bucket_rank,
       bucket.name AS deadline_bucket,
       count(*)         AS items,
       min(deadline)    AS earliest_deadline,
       min(enqueued_at) AS oldest_enqueued_at
FROM work_item,
LATERAL (SELECT * FROM (VALUES
    (1, 'past deadline',   deadline < arbiter_now()),
    (2, 'within 15 min',   deadline < arbiter_now() + interval '15 minutes'),
    (3, 'within 1 hour',   deadline < arbiter_now() + interval '1 hour'),
    (4, 'within 1 day',    deadline < arbiter_now() + interval '1 day'),
    (5, 'later',           deadline IS NOT NULL),
    (6, 'no deadline',     deadline IS NULL)) AS b (rank, name, hit)
    WHERE b.hit ORDER BY b.rank LIMIT 1) AS bucket
WHERE state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now())
GROUP BY flow, bucket.rank, bucket.name;
