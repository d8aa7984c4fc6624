-- Records that key $2 took the leases $1.
INSERT INTO lease_holder (lease_id, key_id)
SELECT unnest($1::bigint[]), $2
ON CONFLICT (lease_id) DO UPDATE SET key_id = EXCLUDED.key_id, taken_at = EXCLUDED.taken_at
