-- Which windows ran over their ceiling, and by how much? (Observe mode,
-- bypasses and count mode all spend slots without being refused; enforced
-- grants never push a window over.)
SELECT w.quota, w.window_start, w.count, q.hourly_ceiling, w.count - q.hourly_ceiling AS over_by
FROM quota_window w
JOIN quota q ON q.name = w.quota
WHERE w.count > q.hourly_ceiling
ORDER BY w.window_start DESC, over_by DESC;
