-- Count slots spent after the fact (count mode, deadline bypass), in one batch.
-- A NULL window means "the window the database clock is in now". Unconditional:
-- these emissions already happened, and `count` must record them.
INSERT INTO quota_window AS w (quota, window_start, count)
SELECT t.quota, coalesce(t.window_start, window_start_of(arbiter_now())), sum(t.slots)
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS t (quota, window_start, slots)
GROUP BY 1, 2
-- Rows in key order, as every multi-quota statement takes them: no deadlock
-- with a claim that locks several windows.
ORDER BY 1, 2
ON CONFLICT (quota, window_start) DO UPDATE
    SET count = w.count + EXCLUDED.count
