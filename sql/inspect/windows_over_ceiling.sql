-- Which windows ran over their ceiling, and by how much? (Observe mode,
-- bypasses and count mode all spend slots without being refused; enforced
-- grants never push a window over.)
SELECT w.quota, w.period, w.window_start, w.count, p.ceiling, w.count - p.ceiling AS over_by
FROM quota_window w
JOIN quota_period p ON p.quota = w.quota AND p.period = w.period
WHERE w.count > p.ceiling
ORDER BY w.window_start DESC, over_by DESC;
