-- Which of quotas $1 have a cadence or in-flight places: a flow that spends
-- several quotas in one call is decided by their windows alone, so it may
-- spend none of these (design.md §12).
SELECT name
FROM quota
WHERE name = ANY ($1::text[]) AND (rate IS NOT NULL OR max_in_flight IS NOT NULL)
ORDER BY name
