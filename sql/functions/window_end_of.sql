-- The end of the window of `period` (in `zone`, for `1d` and `1mo`) that `ts`
-- is in: the next window's start; without a period, the end of the UTC
-- hour. window_start_of() says how windows align and why the body goes
-- through wall time (so the planner can inline it).
CREATE OR REPLACE FUNCTION window_end_of(ts timestamptz, period text DEFAULT '1h',
                                         zone text DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE period
        WHEN '1h'  THEN (date_trunc('hour', ts AT TIME ZONE 'UTC') + interval '1 hour') AT TIME ZONE 'UTC'
        WHEN '1m'  THEN (date_trunc('minute', ts AT TIME ZONE 'UTC') + interval '1 minute') AT TIME ZONE 'UTC'
        WHEN '1mo' THEN (date_trunc('month', ts AT TIME ZONE coalesce(zone, 'UTC')) + interval '1 month')
                        AT TIME ZONE coalesce(zone, 'UTC')
        WHEN '1d'  THEN (date_trunc('day', ts AT TIME ZONE coalesce(zone, 'UTC')) + interval '1 day')
                        AT TIME ZONE coalesce(zone, 'UTC')
        ELSE to_timestamp((floor(date_part('epoch', ts AT TIME ZONE 'UTC') / period_seconds(period)) + 1)
                          * period_seconds(period))
    END
$$;
