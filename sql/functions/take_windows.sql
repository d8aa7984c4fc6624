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
-- One call, one transaction, one statement in the steady state: it locks
-- every window row of the call in key order (quota, period) and reads its
-- count as locked (FOR UPDATE returns the row's latest version), computes
-- each quota's take from those counts and writes it to the rows it holds.
-- Nothing is decided on a count that is not locked: a single conditional
-- upsert can lock only the row it writes, and a take must see every window
-- of its quota as it is. A window row missing (the first take of a window)
-- is created, and the statement runs again (it writes nothing until every
-- window it needs has a row). Every statement that writes windows locks
-- them in the same key order, so concurrent calls wait for each other and
-- never deadlock.
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
    FOR attempt IN 1..2 LOOP
        RETURN QUERY
        WITH asked AS (
            SELECT x.qi, x.n, x.ceiling, p_quotas[x.qi] AS quota, x.period,
                   window_start_of(v_now, x.period, x.zone) AS window_start,
                   window_end_of(v_now, x.period, x.zone) AS window_end
            FROM unnest(p_window_quota, p_periods, p_zones, p_ceilings)
                 WITH ORDINALITY AS x (qi, period, zone, ceiling, n)
        ), locked AS (
            SELECT a.n, w.count
            FROM asked a
            JOIN quota_window w ON w.quota = a.quota AND w.period = a.period
                               AND w.window_start = a.window_start
            ORDER BY w.quota, w.period
            FOR UPDATE OF w
        ), complete AS (
            -- A window whose ceiling is below 1 needs no row: nothing can be
            -- taken from it, and a refusal writes nothing (design.md §3.3).
            SELECT NOT EXISTS (SELECT 1 FROM asked a
                               WHERE a.ceiling >= 1
                                 AND NOT EXISTS (SELECT 1 FROM locked l WHERE l.n = a.n)) AS ok
        ), win AS (
            SELECT a.*, coalesce(l.count, 0) AS count
            FROM asked a LEFT JOIN locked l ON l.n = a.n
        ), per_quota AS (
            -- Each quota's windows at once (grouped, not looked up per quota:
            -- a group of fifty quotas would read every window fifty times).
            SELECT win.qi, min(win.ceiling - win.count) AS room,
                   array_agg(win.window_start ORDER BY win.n) AS starts,
                   array_agg(win.window_end ORDER BY win.n) AS ends,
                   array_agg(win.count ORDER BY win.n) AS counts
            FROM win
            GROUP BY win.qi
        ), take AS (
            SELECT q.qi,
                   CASE WHEN NOT (SELECT ok FROM complete) THEN 0
                        WHEN p_regardless THEN q.wanted
                        WHEN q.wanted < 1 THEN 0
                        WHEN least(q.wanted, r.room) < greatest(q.smallest, 1) THEN 0
                        ELSE least(q.wanted, r.room) END AS taken,
                   coalesce(r.starts, '{}') AS starts, coalesce(r.ends, '{}') AS ends,
                   coalesce(r.counts, '{}') AS counts
            FROM unnest(p_wanted, p_smallest) WITH ORDINALITY AS q (wanted, smallest, qi)
            LEFT JOIN per_quota r ON r.qi = q.qi
        ), spent AS (
            -- The rows are this statement's, locked above: the count it
            -- read is the row's (an update that raced the lock is re-read
            -- by FOR UPDATE, and this write follows it).
            UPDATE quota_window w
            SET count = win.count + t.taken
            FROM win, take t
            WHERE t.qi = win.qi AND t.taken > 0
              AND w.quota = win.quota AND w.period = win.period AND w.window_start = win.window_start
        )
        SELECT t.qi::integer, v_now, t.taken, t.starts, t.ends, t.counts
        FROM take t
        WHERE (SELECT ok FROM complete)
        ORDER BY t.qi;
        IF FOUND OR attempt = 2 THEN
            RETURN;
        END IF;
        INSERT INTO quota_window AS w (quota, period, window_start, count)
        SELECT p_quotas[x.qi], x.period, window_start_of(v_now, x.period, x.zone), 0
        FROM unnest(p_window_quota, p_periods, p_zones, p_ceilings) AS x (qi, period, zone, ceiling)
        WHERE x.ceiling >= 1
        ORDER BY 1, 2
        ON CONFLICT DO NOTHING;
    END LOOP;
END
$$;
