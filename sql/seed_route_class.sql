-- Seed a route class declared in the config file. Never overwrites what the
-- table holds: run-time changes win. Whether a row was inserted.
INSERT INTO route_class (name, burst, rate, capacity, window_seconds, tenant_share,
                         capacity_error_budget)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name) DO NOTHING
