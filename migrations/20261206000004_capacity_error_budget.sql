-- A route class's error budget for capacity refusals (docs/design.md §11):
-- the share of its admissions that may be refused for capacity before the
-- alert QuotaAdmissionCapacityExhausted fires (the metric
-- quota_admit_capacity_error_budget carries it to Prometheus). 1 % until set.
ALTER TABLE route_class ADD COLUMN capacity_error_budget float8 NOT NULL DEFAULT 0.01
    CONSTRAINT route_class_capacity_error_budget_range
    CHECK (capacity_error_budget > 0 AND capacity_error_budget <= 1);
