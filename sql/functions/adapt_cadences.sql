-- Upstream feedback for a group of reports (docs/design.md §8): report i
-- says that quota p_quotas[i]'s upstream answered p_statuses[i] (0: the
-- call timed out). Each quota's adaptive factor, recovered to now
-- (recovered_factor), is multiplied by the multiplier of each of its
-- reports' statuses (upstream_multiplier; a status without one changes
-- nothing) in the order given, never above 1 nor below the factor that
-- keeps the rate at 0.01/s: what one report after the other would leave,
-- at one instant. Quotas with adaptive = false, or without a cadence, are
-- left alone. The effective rate is at least 0.01/s, never above the
-- configured one (client/src/adapt.rs computes the same rule).
--
-- One statement for the group: the buckets it touches are locked in quota
-- order, each written once. One row per report, in the order given: the
-- factor right after it and the effective cadence then; NULLs for a report
-- that adapted nothing.
CREATE OR REPLACE FUNCTION adapt_cadences(p_quotas text[], p_statuses integer[])
RETURNS TABLE (o_report integer, o_factor double precision,
               o_effective_rate double precision, o_effective_burst double precision)
LANGUAGE plpgsql AS $$
DECLARE
    v_reports integer := coalesce(cardinality(p_quotas), 0);
    v_bucket record;
    v_factor double precision;
    v_multiplier double precision;
    v_changed boolean;
    v_after double precision[] := '{}';
    v_rate double precision[] := '{}';
    v_burst double precision[] := '{}';
BEGIN
    FOR v_bucket IN
        SELECT b.quota, b.factor, b.factor_at, q.rate, q.burst
        FROM quota_bucket b
        JOIN quota q ON q.name = b.quota
        WHERE b.quota = ANY (p_quotas) AND q.adaptive AND q.rate IS NOT NULL
        ORDER BY b.quota
        FOR UPDATE OF b
    LOOP
        v_factor := recovered_factor(v_bucket.factor, v_bucket.factor_at);
        v_changed := false;
        FOR i IN 1..v_reports LOOP
            CONTINUE WHEN p_quotas[i] IS DISTINCT FROM v_bucket.quota;
            v_multiplier := upstream_multiplier(p_statuses[i]);
            CONTINUE WHEN v_multiplier IS NULL;
            v_factor := least(1.0, greatest(least(1.0, 0.01 / v_bucket.rate),
                                            v_factor * v_multiplier));
            v_changed := true;
            v_after[i] := v_factor;
            v_rate[i] := least(v_bucket.rate, greatest(0.01, v_bucket.rate * v_factor));
            v_burst[i] := greatest(1.0, v_bucket.burst * v_factor);
        END LOOP;
        IF v_changed THEN
            UPDATE quota_bucket
            SET factor = v_factor, factor_at = greatest(factor_at, arbiter_now())
            WHERE quota = v_bucket.quota;
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT i, v_after[i], v_rate[i], v_burst[i]
    FROM generate_series(1, v_reports) AS i;
END
$$;
