-- Holder records of leases long expired (a lease lasts 60 s at most), a batch
-- of $2 at a time.
DELETE FROM lease_holder
WHERE lease_id IN (
    SELECT lease_id FROM lease_holder
    WHERE taken_at < arbiter_now() - make_interval(secs => $1::float8)
    ORDER BY taken_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
