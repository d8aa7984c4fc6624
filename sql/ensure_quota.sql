-- Make sure a quota exists (a flow may name a quota before anyone sized it),
-- with the hour $2 as its window (quota_hour_to_window()); an existing
-- quota keeps its windows.
INSERT INTO quota (name, hourly_ceiling)
VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING
