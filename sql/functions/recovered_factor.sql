-- The adaptive factor now: recovered passively by 0.5% per second of database
-- time since it was last set, never above 1. The worker client computes the
-- same rule (client/src/adapt.rs, recovered_factor()); tests/it/rules.rs
-- checks that both answer alike.
--
-- In double precision: since PostgreSQL 14, extract(epoch FROM interval)
-- answers numeric, which made power() an exponentiation in arbitrary
-- precision: about 6 µs a call, against about 0.5 µs in double precision
-- (measured 2026-12-01, this project's CI machine kind). The paced statement
-- calls it for every adaptive bucket it locks. A factor already back at 1 (no
-- upstream error lately: the usual case) is answered without the power at all.
CREATE OR REPLACE FUNCTION recovered_factor(factor double precision, factor_at timestamptz)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN factor >= 1.0 THEN 1.0::float8
                ELSE least(1.0::float8,
                           factor * power(1.005::float8,
                                          greatest(0, extract(epoch FROM arbiter_now() - factor_at))::float8))
           END
$$;
