-- Count slots spent after the fact (count mode, deadline bypass), in one
-- batch: each in every window of its quota (quota_period) that the instant
-- it was spent at falls in; a NULL instant means "now, by the database
-- clock". A quota without windows counts in its hour, and a quota not
-- there (yet) fails the batch on quota_window's foreign key, so that it is
-- tried again. Unconditional: these emissions already happened, and
-- `count` must record them.
INSERT INTO quota_window AS w (quota, period, window_start, count)
SELECT t.quota, coalesce(p.period, '1h'),
       window_start_of(coalesce(t.spent_at, arbiter_now()), coalesce(p.period, '1h'), p.zone),
       sum(t.slots)
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS t (quota, spent_at, slots)
LEFT JOIN quota_period p ON p.quota = t.quota
GROUP BY 1, 2, 3
-- Rows in key order, as every statement that writes windows takes them: no
-- deadlock with a take that locks several.
ORDER BY 1, 2, 3
ON CONFLICT (quota, period, window_start) DO UPDATE
    SET count = w.count + EXCLUDED.count
