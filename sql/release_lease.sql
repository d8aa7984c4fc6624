-- Frees the slot held by lease $1 and feeds how long it was held into the
-- flow's moving average (avg = avg * 0.9 + held * 0.1): the emission's own
-- duration $2 (seconds) when the worker reported one, else the time since the
-- lease was taken. A lease that already expired and was taken again is not
-- found: nothing happens.
WITH held AS (
    SELECT s.quota, s.slot, s.flow,
           coalesce($2::float8, extract(epoch FROM arbiter_now() - s.taken_at)::float8) AS seconds
    FROM quota_slot s
    WHERE s.lease_id = $1
    FOR UPDATE
), freed AS (
    UPDATE quota_slot s
    SET lease_id = NULL, flow = NULL, taken_at = NULL, valid_until = NULL
    FROM held h
    WHERE s.quota = h.quota AND s.slot = h.slot
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
       (SELECT avg_seconds FROM averaged) AS "avg_seconds?"
