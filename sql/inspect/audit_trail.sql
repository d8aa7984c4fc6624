-- Who changed which quota or flow, when, from what to what? (Newest first.)
SELECT changed_at, actor, entity, name, field, from_value, to_value
FROM catalog_audit
ORDER BY id DESC
LIMIT 100;
