-- Delete flow $1, unless work items of it are not done yet (they would be
-- claimed as never throttled): then nothing is deleted and they are counted.
WITH open_work AS (
    -- Pending or claimed (not done), spelled so that each side finds its
    -- own index (pending by flow, claimed by when their lease runs out).
    SELECT count(*) AS items FROM work_item
    WHERE flow = $1 AND (state = 'pending' OR state = 'claimed')
), deleted AS (
    DELETE FROM flow f
    WHERE f.name = $1 AND (SELECT items FROM open_work) = 0
    RETURNING f.name
)
SELECT (SELECT count(*) FROM deleted) AS "deleted!", (SELECT items FROM open_work) AS "open_work!"
