-- Which of the flows $1 hold claimable work outside the bypass horizon ($2
-- seconds). A hint that spares a claim the quotas with nothing to claim; it
-- never decides who gets a slot. One short index probe per flow.
SELECT f.name AS "flow!"
FROM unnest($1::text[]) AS f (name)
WHERE EXISTS (
    SELECT 1 FROM work_item w
    WHERE w.flow = f.name
      AND w.state <> 'done'
      AND (w.state = 'pending' OR w.lease_until < arbiter_now())
      AND (w.deadline IS NULL OR w.deadline > arbiter_now() + make_interval(secs => $2::float8))
)
