-- $2 pending work items of flow $1, enqueued in one statement: the queue the
-- claim transaction replayed by pgbench drains.
INSERT INTO work_item (flow, priority, payload)
SELECT $1::text, 1, jsonb_build_object('n', n)
FROM generate_series(1, $2::integer) AS n
