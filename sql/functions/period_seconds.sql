-- The length in seconds of a period that divides a day (`1s` … `1d`: a
-- number and s, m, h or d); NULL for `1mo` (a calendar month, whose length
-- varies) and for anything else. IMMUTABLE and inlinable, as
-- window_start_of() needs (it says why).
CREATE OR REPLACE FUNCTION period_seconds(period text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN period ~ '^[1-9][0-9]{0,4}[smhd]$'
                THEN left(period, -1)::bigint
                     * CASE right(period, 1) WHEN 's' THEN 1 WHEN 'm' THEN 60
                                             WHEN 'h' THEN 3600 ELSE 86400 END
           END
$$;
