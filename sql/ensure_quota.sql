-- Make sure a quota exists (a flow may name a quota before anyone sized it);
-- an existing quota keeps its ceiling.
INSERT INTO quota (name, hourly_ceiling)
VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING
