-- When was each flow moved between observe, enforce and count, and by whom?
SELECT changed_at, name AS flow, from_value AS from_mode, to_value AS to_mode, actor
FROM catalog_audit
WHERE entity = 'flow' AND field = 'mode'
ORDER BY changed_at DESC;
