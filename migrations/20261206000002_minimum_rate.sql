-- A cadence of at least 1e-6 per second (src/domain.rs, MIN_RATE): a rate
-- near the smallest double underflows in the refill, an error for every
-- decision on the quota. NOT VALID: a row written before keeps working
-- until it is next changed.
ALTER TABLE quota ADD CONSTRAINT quota_rate_min CHECK (rate >= 1e-6) NOT VALID;
ALTER TABLE route_class ADD CONSTRAINT route_class_rate_min CHECK (rate >= 1e-6) NOT VALID;
