-- Several quotas per call (design.md §12). A flow spends `quota` (the one
-- its answers name) and, after it, `further_quotas` in order: every call of
-- the flow spends all of them or none. check_flow_quotas() keeps each an
-- existing quota, named once.
ALTER TABLE flow ADD COLUMN further_quotas text[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(further_quotas) <= 7);

CREATE TRIGGER flow_quotas BEFORE INSERT OR UPDATE OF quota, further_quotas ON flow
    FOR EACH ROW EXECUTE FUNCTION check_flow_quotas();
CREATE TRIGGER quota_spent_by_flows BEFORE DELETE ON quota
    FOR EACH ROW EXECUTE FUNCTION check_flow_quotas();

-- A reservation of several quotas is a row per quota under one id.
ALTER TABLE reservation DROP CONSTRAINT reservation_pkey;
ALTER TABLE reservation ADD PRIMARY KEY (id, quota);
-- Its place among the flow's quotas (1: the flow's own, which answers name).
ALTER TABLE reservation ADD COLUMN position smallint NOT NULL DEFAULT 1;
