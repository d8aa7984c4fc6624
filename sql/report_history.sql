-- How far back the report can look: the oldest window with decision tallies
-- still kept (of quota $1, or of any quota).
SELECT min(window_start) AS "oldest_tally?"
FROM decision_tally
WHERE $1::text IS NULL OR quota = $1
