-- A lease id is what a worker shows to free a place: it must not be guessable
-- from another one, so it does not come from a sequence.
-- 60 random bits of a version-4 UUID (its first 12 hex digits and the 3 after
-- the fixed version digit): a positive bigint. A collision with a live lease
-- (about n / 2^60 for n live leases) fails the statement on the unique index:
-- an error, never a shared lease.
CREATE OR REPLACE FUNCTION new_lease_id() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(u, 1, 12) || substr(u, 14, 3))::bit(60)::bigint
    FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS u) uuid
$$;
