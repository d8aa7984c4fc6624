-- Frees the place held by lease $1 and feeds how long it was held into the
-- flow's moving average (avg = avg * 0.9 + held * 0.1): the emission's own
-- duration $2 (seconds) when the worker reported one, else the time since the
-- lease was taken. A lease that already expired and was taken again is not
-- found: nothing happens. With $3 (a flow) or $4 (a quota), a lease held by
-- another flow or quota is left alone and its holder returned instead.
WITH lease AS (
    SELECT s.quota, s.place, s.flow, s.taken_at
    FROM quota_place s
    WHERE s.lease_id = $1
    FOR UPDATE
), held AS (
    SELECT quota, place, flow,
           coalesce($2::float8, extract(epoch FROM arbiter_now() - taken_at)::float8) AS seconds
    FROM lease
    WHERE ($3::text IS NULL OR flow = $3) AND ($4::text IS NULL OR quota = $4)
), freed AS (
    UPDATE quota_place s
    SET lease_id = NULL, flow = NULL, taken_at = NULL, valid_until = NULL
    FROM held h
    WHERE s.quota = h.quota AND s.place = h.place
    RETURNING h.flow, h.seconds
), averaged AS (
    INSERT INTO flow_lease_duration AS d (flow, avg_seconds)
    SELECT flow, seconds FROM freed
    ON CONFLICT (flow) DO UPDATE
        SET avg_seconds = d.avg_seconds * 0.9 + EXCLUDED.avg_seconds * 0.1,
            samples = d.samples + 1
    RETURNING d.avg_seconds
)
SELECT (SELECT flow FROM freed)           AS "flow?",
       (SELECT seconds FROM freed)        AS "held_seconds?",
       (SELECT avg_seconds FROM averaged) AS "avg_seconds?",
       (SELECT flow FROM lease)           AS "holder_flow?",
       (SELECT quota FROM lease)          AS "holder_quota?"
