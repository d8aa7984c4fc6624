-- After a claim that got nothing: how many items of the worker's flows ($1,
-- NULL: all) are pending (claims whose lease ran out included), how many of
-- them are claimable now (the rest wait out a retry delay), the earliest time
-- one of those could be granted: when the first window of their quotas ends
-- (the next UTC hour without one), or sooner when one enters the bypass
-- horizon ($2 seconds); and when the first retry delay ends.
WITH next_window AS (
    SELECT coalesce(min(window_end_of(arbiter_now(), p.period, p.zone)),
                    window_end_of(arbiter_now())) AS ends_at
    FROM flow f
    JOIN quota_period p ON p.quota = f.quota
    WHERE $1::text[] IS NULL OR f.name = ANY($1::text[])
)
SELECT arbiter_now() AS "db_now!",
       count(*) AS "pending!",
       count(*) FILTER (WHERE coalesce(not_before <= arbiter_now(), true)) AS "claimable!",
       -- (least/greatest skip NULLs: without deadlines it is the next window.)
       greatest(arbiter_now(),
                least((SELECT ends_at FROM next_window),
                      coalesce(min(deadline) FILTER (WHERE coalesce(not_before <= arbiter_now(), true))
                                   - make_interval(secs => $2::float8),
                               (SELECT ends_at FROM next_window))))
           AS "retry_at!",
       min(not_before) FILTER (WHERE not_before > arbiter_now()) AS next_not_before
FROM work_item
WHERE (state = 'pending' OR (state = 'claimed' AND lease_until < arbiter_now()))
  AND ($1::text[] IS NULL OR flow = ANY($1::text[]))
