-- Work items of flow $1 not done yet (pending or claimed), spelled so that
-- each side finds its own index, as sql/delete_flow.sql does.
SELECT count(*) AS "items!" FROM work_item
WHERE flow = $1 AND (state = 'pending' OR state = 'claimed')
