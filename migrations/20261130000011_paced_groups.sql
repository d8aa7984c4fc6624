-- Paced quotas (a cadence, in-flight places or both) are decided a group at a
-- time. A lease id is what a worker shows to free a place: it must not be
-- guessable from another one, so it no longer comes from a sequence.

-- 60 random bits of a version-4 UUID (its first 12 hex digits and the 3 after
-- the fixed version digit): a positive bigint. A collision with a live lease
-- (about n / 2^60 for n live leases) fails the statement on the unique index:
-- an error, never a shared lease.
CREATE FUNCTION new_lease_id() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(u, 1, 12) || substr(u, 14, 3))::bit(60)::bigint
    FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS u) uuid
$$;

DROP SEQUENCE lease_id_seq;

-- Free places (never leased: -infinity; expired: in the past) and the first
-- lease to expire, found by an index range scan rather than by reading every
-- place of a quota: a quota may have 10,000 of them, most of them leased.
CREATE INDEX quota_place_free_from ON quota_place (quota, (coalesce(valid_until, '-infinity')));
