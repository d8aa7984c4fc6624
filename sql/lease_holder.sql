-- The key that took lease $1, if one is recorded.
SELECT key_id FROM lease_holder WHERE lease_id = $1
