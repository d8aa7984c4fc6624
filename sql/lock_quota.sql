-- A quota's stored settings, locked until the patch that read them commits.
SELECT hourly_ceiling, rate, burst, adaptive, max_in_flight, priority2_share, priority3_share
FROM quota
WHERE name = $1
FOR UPDATE
