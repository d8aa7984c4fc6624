-- Delete quota $1 and its windows, unless a flow still spends it: then
-- nothing is deleted and the flows are named. Its bucket and concurrency
-- slots go with it (ON DELETE CASCADE); tallies stay as history.
WITH users AS (
    SELECT coalesce(array_agg(name ORDER BY name), '{}') AS flows FROM flow
    WHERE quota = $1 OR $1 = ANY (further_quotas)
), windows AS (
    DELETE FROM quota_window w
    WHERE w.quota = $1 AND (SELECT cardinality(flows) FROM users) = 0
), deleted AS (
    DELETE FROM quota q
    WHERE q.name = $1 AND (SELECT cardinality(flows) FROM users) = 0
    RETURNING q.name
)
SELECT (SELECT count(*) FROM deleted) AS "deleted!", (SELECT flows FROM users) AS "flows!"
