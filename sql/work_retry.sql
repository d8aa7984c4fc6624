-- After a claim that got nothing: how many items of the worker's flows ($1,
-- NULL: all) are pending (claims whose lease ran out included), how many of
-- them are claimable now (the rest wait out a retry delay), the earliest time
-- one of those could be granted: the next window, or sooner when one enters
-- the bypass horizon ($2 seconds); and when the first retry delay ends.
SELECT arbiter_now() AS "db_now!",
       count(*) AS "pending!",
       count(*) FILTER (WHERE coalesce(not_before <= arbiter_now(), true)) AS "claimable!",
       -- (least/greatest skip NULLs: without deadlines it is the next window.)
       greatest(arbiter_now(),
                least(window_end_of(arbiter_now()),
                      coalesce(min(deadline) FILTER (WHERE coalesce(not_before <= arbiter_now(), true))
                                   - make_interval(secs => $2::float8),
                               window_end_of(arbiter_now()))))
           AS "retry_at!",
       min(not_before) FILTER (WHERE not_before > arbiter_now()) AS next_not_before
FROM work_item
WHERE (state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now()))
  AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
