-- Create a route class or replace its settings; the caller checked them.
INSERT INTO route_class AS r (name, burst, rate, capacity, window_seconds, tenant_share,
                              capacity_error_budget)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name) DO UPDATE
    SET burst          = EXCLUDED.burst,
        rate           = EXCLUDED.rate,
        capacity       = EXCLUDED.capacity,
        window_seconds = EXCLUDED.window_seconds,
        tenant_share   = EXCLUDED.tenant_share,
        capacity_error_budget = EXCLUDED.capacity_error_budget,
        updated_at     = arbiter_now()
RETURNING r.name, r.burst, r.rate, r.capacity, r.window_seconds, r.tenant_share,
          r.capacity_error_budget, r.created_at, r.updated_at
