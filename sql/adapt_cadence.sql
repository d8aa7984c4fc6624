-- Upstream feedback for a group of reports: report i says that quota $1[i]'s
-- upstream answered status $2[i]; adapt_cadences()
-- (sql/functions/adapt_cadences.sql, which describes the rule) folds each
-- quota's reports into its adaptive factor in the order given. One row per
-- report, in that order: the factor right after it and the effective
-- cadence then, NULL where it adapted nothing.
SELECT t.o_report          AS "report!",
       t.o_factor          AS "factor?",
       t.o_effective_rate  AS "effective_rate?",
       t.o_effective_burst AS "effective_burst?"
FROM adapt_cadences($1::text[], $2::integer[]) AS t
ORDER BY t.o_report
