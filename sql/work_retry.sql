-- After a claim that got nothing: how many claimable items the worker's flows
-- ($1, NULL: all) hold, and the earliest time one could be granted: the next
-- window, or sooner when an item enters the bypass horizon ($2 seconds).
SELECT arbiter_now() AS "db_now!",
       count(*) AS "claimable!",
       -- (least/greatest skip NULLs: without deadlines it is the next window.)
       greatest(arbiter_now(),
                least(window_end_of(arbiter_now()),
                      coalesce(min(deadline) - make_interval(secs => $2::float8),
                               window_end_of(arbiter_now()))))
           AS "retry_at!"
FROM work_item
WHERE (state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now()))
  AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
