-- Budget takes across quotas with stacked windows (docs/design.md §8, §12),
-- all or nothing per quota: quota i of $1 takes t_i slots in every one of its
-- windows or in none, where t_i = least(wanted, what the fullest window has
-- left), or 0 when that is below the smallest request of its group (so a
-- lone request is all or nothing). Window j is of quota p_window_quota[j]
-- (an index into $1), its `period`, `zone` and the ceiling the group may
-- reach in it (the highest ceiling among the group's requests). A quota
-- without windows has no budget: it takes what it wants.
--
-- p_regardless (observe mode): every window spends what was wanted, whatever
-- its count, so that each count stays the honest record of every slot spent.
--
-- One call, one transaction, three statements: the missing window rows are
-- created, every row is locked in key order (quota, period), then each
-- quota's take is computed from the locked counts and written. Nothing is
-- decided on a count that is not locked (a single conditional upsert can
-- lock only the row it writes, and a take must see every window of its quota
-- as it is); every statement that writes windows locks them in the same key
-- order, so concurrent calls wait for each other and never deadlock.
--
-- One row per quota, in the order of $1: the take and, per window in the
-- order given, its bounds and its count before the take.
CREATE OR REPLACE FUNCTION take_windows(
    p_quotas text[], p_wanted bigint[], p_smallest bigint[],
    p_window_quota integer[], p_periods text[], p_zones text[], p_ceilings bigint[],
    p_regardless boolean
) RETURNS TABLE (
    o_quota_index integer, o_db_now timestamptz, o_taken bigint,
    o_window_starts timestamptz[], o_window_ends timestamptz[], o_counts_before bigint[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := arbiter_now();
BEGIN
    -- A window whose ceiling is below 1 gets no row: nothing can be taken
    -- from it, and a refusal writes nothing (design.md §3.3).
    INSERT INTO quota_window AS w (quota, period, window_start, count)
    SELECT p_quotas[x.qi], x.period, window_start_of(v_now, x.period, x.zone), 0
    FROM unnest(p_window_quota, p_periods, p_zones, p_ceilings) AS x (qi, period, zone, ceiling)
    WHERE x.ceiling >= 1
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;

    PERFORM 1
    FROM unnest(p_window_quota, p_periods, p_zones) AS x (qi, period, zone)
    JOIN quota_window w ON w.quota = p_quotas[x.qi] AND w.period = x.period
                       AND w.window_start = window_start_of(v_now, x.period, x.zone)
    ORDER BY w.quota, w.period
    FOR UPDATE OF w;

    RETURN QUERY
    WITH win AS (
        -- Each window with its count, as locked above (this statement's
        -- snapshot sees every change committed before the locks were held).
        SELECT x.qi, x.n, x.ceiling, p_quotas[x.qi] AS quota, x.period,
               window_start_of(v_now, x.period, x.zone) AS window_start,
               window_end_of(v_now, x.period, x.zone) AS window_end,
               coalesce(w.count, 0) AS count
        FROM unnest(p_window_quota, p_periods, p_zones, p_ceilings)
             WITH ORDINALITY AS x (qi, period, zone, ceiling, n)
        LEFT JOIN quota_window w ON w.quota = p_quotas[x.qi] AND w.period = x.period
                                AND w.window_start = window_start_of(v_now, x.period, x.zone)
    ), take AS (
        SELECT q.qi,
               CASE WHEN p_regardless THEN q.wanted
                    WHEN q.wanted < 1 THEN 0
                    WHEN least(q.wanted, r.room) < greatest(q.smallest, 1) THEN 0
                    ELSE least(q.wanted, r.room) END AS taken
        FROM unnest(p_wanted, p_smallest) WITH ORDINALITY AS q (wanted, smallest, qi),
        LATERAL (SELECT min(win.ceiling - win.count) AS room FROM win WHERE win.qi = q.qi) AS r
    ), spent AS (
        UPDATE quota_window w
        SET count = w.count + t.taken
        FROM win, take t
        WHERE t.qi = win.qi AND t.taken > 0
          AND w.quota = win.quota AND w.period = win.period AND w.window_start = win.window_start
    )
    SELECT t.qi::integer, v_now, t.taken,
           coalesce(array_agg(win.window_start ORDER BY win.n) FILTER (WHERE win.n IS NOT NULL), '{}'),
           coalesce(array_agg(win.window_end ORDER BY win.n) FILTER (WHERE win.n IS NOT NULL), '{}'),
           coalesce(array_agg(win.count ORDER BY win.n) FILTER (WHERE win.n IS NOT NULL), '{}')
    FROM take t
    LEFT JOIN win ON win.qi = t.qi
    GROUP BY t.qi, t.taken
    ORDER BY t.qi;
END
$$;
