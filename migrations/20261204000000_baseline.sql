-- The schema as one baseline: tables, indexes, constraints and triggers.
--
-- Migrations are append-only from here: a change to a table is a new file in
-- migrations/, never an edit of an applied one (sqlx refuses a database whose
-- applied migrations' checksums differ from the files').
--
-- Functions and views are not here: each lives in a file of its own under
-- sql/functions/ and sql/views/, the one place its current text is, and
-- `store::migrate` (src/store/bootstrap.rs, `serve` and `quota-arbiter
-- migrate`) applies them on every migrate, in the order of its manifest:
-- functions missing from the database before the migrations (these column
-- defaults and triggers call arbiter_now() and the trigger functions), then,
-- after them, every function again and every view, in one transaction.
-- docs/operations/upgrades.md says how to change one.
--
-- This baseline is what migrations 20261130000001 to 20261130000028 (git
-- history) left; a database migrated by those refuses it.

-- Quotas: the budget of a third-party API (hourly slots), its cadence
-- (a token bucket) and its in-flight places.
CREATE TABLE quota (
    name           text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    -- Bounded so that count + k can never overflow.
    hourly_ceiling bigint NOT NULL CHECK (hourly_ceiling <= 9007199254740992),
    created_at     timestamptz NOT NULL DEFAULT arbiter_now(),
    updated_at     timestamptz NOT NULL DEFAULT arbiter_now(),
    -- Cadence: sustained tokens per second and bucket size; both or neither.
    -- Bounded so that refill arithmetic can never overflow.
    rate           double precision CHECK (rate > 0 AND rate <= 1e6),
    burst          double precision CHECK (burst >= 1 AND burst <= 1e9),
    -- Shrink rate and burst on upstream 429/timeout/5xx, recover when quiet.
    adaptive       boolean NOT NULL DEFAULT true,
    max_in_flight  integer CHECK (max_in_flight BETWEEN 1 AND 10000),
    -- Headroom: priority-2 and priority-3 flows may use only this share of the
    -- ceiling (percent), leaving the rest to priority 1. NULL: no cap.
    priority2_share smallint CHECK (priority2_share BETWEEN 0 AND 100),
    priority3_share smallint CHECK (priority3_share BETWEEN 0 AND 100),
    CONSTRAINT quota_cadence_pair CHECK ((rate IS NULL) = (burst IS NULL))
);

CREATE TABLE flow (
    name       text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    quota      text NOT NULL REFERENCES quota (name),
    mode       text NOT NULL DEFAULT 'observe' CHECK (mode IN ('observe', 'enforce', 'count')),
    priority   smallint NOT NULL DEFAULT 2 CHECK (priority BETWEEN 1 AND 9),
    created_at timestamptz NOT NULL DEFAULT arbiter_now(),
    updated_at timestamptz NOT NULL DEFAULT arbiter_now(),
    -- Gradual rollout: an enforced flow with enforce_percent < 100 defers only
    -- that share of its over-ceiling decisions (deterministic per `ref`); the
    -- rest are granted as observed. NULL means 100 (normalize_enforce_percent()
    -- keeps it so, and NULL outside enforce mode).
    enforce_percent smallint CHECK (enforce_percent BETWEEN 1 AND 100),
    -- What a worker's client does for the flow when the arbiter is unreachable
    -- (design.md §12). 'off': the call fails. 'local': the client decides
    -- locally at its last known share of the quota (GET /v1/stream), waits
    -- rather than refuses, and reports the slots it spent that way once the
    -- arbiter answers again.
    fallback   text NOT NULL DEFAULT 'off' CHECK (fallback IN ('off', 'local'))
);

CREATE INDEX flow_quota_idx ON flow (quota);

-- One row per quota and UTC hour. `count` is the honest record of every slot
-- spent in the window by any path (granted, observed over the ceiling,
-- bypassed, counted), so count > ceiling stays visible in SQL.
CREATE TABLE quota_window (
    quota        text NOT NULL REFERENCES quota (name),
    window_start timestamptz NOT NULL,
    count        bigint NOT NULL DEFAULT 0 CHECK (count >= 0),
    -- How many slots the last take-up-to-k upsert on this row took. RETURNING
    -- only sees the new row, so the amount taken travels back in this column
    -- from the same single statement (no read-then-write).
    last_take    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (quota, window_start)
);

-- Pruning of history past `history_retention` finds the oldest windows.
CREATE INDEX quota_window_start_idx ON quota_window (window_start);

-- Decisions per window, quota and flow, by outcome. Written in batches off the
-- hot path; observation only. `quota` is NULL for flows the arbiter does not
-- know. (The unique key leads with window_start: pruning uses it.)
CREATE TABLE decision_tally (
    window_start timestamptz NOT NULL,
    quota        text,
    flow         text NOT NULL,
    granted      bigint NOT NULL DEFAULT 0,
    deferred     bigint NOT NULL DEFAULT 0,
    would_defer  bigint NOT NULL DEFAULT 0,
    bypassed     bigint NOT NULL DEFAULT 0,
    unthrottled  bigint NOT NULL DEFAULT 0,
    -- Observe-mode decisions over the ceiling that carried a deadline.
    would_defer_with_deadline bigint NOT NULL DEFAULT 0,
    CONSTRAINT decision_tally_key UNIQUE NULLS NOT DISTINCT (window_start, quota, flow)
);

-- Every change to a quota, flow or route class, recorded by the database
-- itself, whoever made it (audit_catalog_change()). `actor` is what the API or
-- CLI declared for its transaction (SET LOCAL quota_arbiter.actor), else the
-- database role (raw SQL).
CREATE TABLE catalog_audit (
    id         bigserial PRIMARY KEY,
    changed_at timestamptz NOT NULL DEFAULT arbiter_now(),
    actor      text NOT NULL,
    entity     text NOT NULL CHECK (entity IN ('quota', 'flow', 'route_class')),
    name       text NOT NULL,
    field      text NOT NULL,
    from_value text,
    to_value   text
);

CREATE INDEX catalog_audit_name_idx ON catalog_audit (entity, name, changed_at DESC);
-- Pruning past `audit_retention` finds the oldest entries.
CREATE INDEX catalog_audit_changed_at_idx ON catalog_audit (changed_at);

CREATE TRIGGER quota_audit AFTER INSERT OR UPDATE OR DELETE ON quota
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();
CREATE TRIGGER flow_audit AFTER INSERT OR UPDATE OR DELETE ON flow
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();

CREATE TRIGGER flow_enforce_percent BEFORE INSERT OR UPDATE ON flow
    FOR EACH ROW EXECUTE FUNCTION normalize_enforce_percent();

-- Pending work. A claim is a lease: `claimed` with `lease_until` in the past
-- counts as pending again (the worker died); its slot stays spent.
CREATE TABLE work_item (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Not a foreign key: a flow the arbiter does not know is never throttled.
    flow        text NOT NULL CHECK (flow ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    -- The caller's idempotency key: enqueueing the same ref twice is one item.
    ref         text UNIQUE CHECK (length(ref) BETWEEN 1 AND 256),
    deadline    timestamptz,
    -- The flow's priority at enqueue time unless the item named its own.
    priority    smallint NOT NULL CHECK (priority BETWEEN 1 AND 9),
    payload     jsonb NOT NULL,
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'claimed', 'done')),
    -- How the last claim was decided: granted (a slot), bypassed, unthrottled.
    outcome     text CHECK (outcome IN ('granted', 'bypassed', 'unthrottled')),
    attempts    integer NOT NULL DEFAULT 0,
    claimed_by  text,
    enqueued_at timestamptz NOT NULL DEFAULT arbiter_now(),
    claimed_at  timestamptz,
    lease_until timestamptz,
    done_at     timestamptz,
    -- A claim on a quota with `max_in_flight` holds an in-flight place like
    -- any grant; the item remembers that lease so finishing the item frees
    -- the place.
    place_lease_id bigint,
    -- Every claim spends a slot, so an item whose emission failed must not be
    -- claimable again at once: a release sets when it may be claimed again
    -- (NULL: now). Only a pending item waits; a claim clears it. A waiting
    -- item is still pending: the pending views count it.
    not_before  timestamptz,
    CHECK ((state = 'claimed') = (lease_until IS NOT NULL)),
    CHECK ((state = 'done') = (done_at IS NOT NULL)),
    CONSTRAINT work_item_not_before_pending CHECK (not_before IS NULL OR state = 'pending')
);

-- Claims walk only what they may claim: pending items in rationing order
-- (deadline ASC NULLS LAST, the btree default, then priority, then first come
-- first served), by flow where the claim names its flows; claimed items by
-- when their lease runs out, so a walk for lapsed leases reads only those.
-- Every index here is an entry every enqueue and claim writes: none is kept
-- without a reader.
CREATE INDEX work_item_pending_flow_idx ON work_item (flow, deadline, priority, id)
    WHERE state = 'pending';
CREATE INDEX work_item_pending_queue_idx ON work_item (deadline, priority, id)
    WHERE state = 'pending';
CREATE INDEX work_item_lease_idx ON work_item (lease_until)
    WHERE state = 'claimed';
-- Done items are kept for `work_retention`, then pruned oldest first.
CREATE INDEX work_item_done_idx ON work_item (done_at) WHERE state = 'done';

-- O(1) cadence state per quota: tokens at refilled_at, and the adaptive factor
-- (0 < factor <= 1) applied to rate and burst as of factor_at.
CREATE TABLE quota_bucket (
    quota       text PRIMARY KEY REFERENCES quota (name) ON DELETE CASCADE,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    factor      double precision NOT NULL DEFAULT 1 CHECK (factor > 0 AND factor <= 1),
    factor_at   timestamptz NOT NULL
);

-- One word, one meaning: a "slot" is a unit of a quota's hourly budget
-- (quota_window.count); one of a quota's max_in_flight concurrent emissions is
-- a "place", held by a lease. One row per place; a place is free when it
-- holds no lease or its lease has expired (a crashed worker cannot keep it).
-- Lease ids come from new_lease_id(): unguessable.
CREATE TABLE quota_place (
    quota       text NOT NULL,
    place       integer NOT NULL,
    lease_id    bigint,
    flow        text,
    taken_at    timestamptz,
    valid_until timestamptz,
    CONSTRAINT quota_place_pkey PRIMARY KEY (quota, place),
    CONSTRAINT quota_place_lease_id_key UNIQUE (lease_id),
    CONSTRAINT quota_place_quota_fkey FOREIGN KEY (quota) REFERENCES quota (name) ON DELETE CASCADE
);

-- Free places (never leased: -infinity; expired: in the past) and the first
-- lease to expire, found by an index range scan rather than by reading every
-- place of a quota: a quota may have 10,000 of them, most of them leased.
CREATE INDEX quota_place_free_from ON quota_place (quota, (coalesce(valid_until, '-infinity')));

-- Exponential moving average of how long a flow's emissions hold a lease.
CREATE TABLE flow_lease_duration (
    flow        text PRIMARY KEY,
    avg_seconds double precision NOT NULL,
    samples     bigint NOT NULL DEFAULT 1
);

CREATE TRIGGER quota_limits AFTER INSERT OR UPDATE OF rate, burst, max_in_flight ON quota
    FOR EACH ROW EXECUTE FUNCTION sync_quota_limits();

-- Connected share streams (GET /v1/stream, design.md §10): one
-- row per connected client on any replica, its heartbeat renewed every
-- second. A quota's live clients are the rows seen within the last 3 s whose
-- flows spend it; a client gone without a goodbye stops counting then.
-- UNLOGGED: presence only, nothing to recover after a crash.
CREATE UNLOGGED TABLE stream_client (
    id      bigserial PRIMARY KEY,
    flows   text[] NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT arbiter_now()
);

-- Keys for the arbiter's own API (design.md §4): who may call what. Only a
-- hash of each key is kept; the key itself is shown once, when created.
CREATE TABLE api_key (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text,
    role        text NOT NULL CHECK (role IN ('worker', 'operator', 'admin')),
    tenant      text,
    hash        bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT arbiter_now(),
    revoked_at  timestamptz
);

CREATE TRIGGER api_key_announce AFTER INSERT OR UPDATE OR DELETE ON api_key
    FOR EACH ROW EXECUTE FUNCTION announce_api_key_change();

-- Which key took a concurrency lease, so that only that key (or an admin)
-- frees it. Kept beside `quota_place` rather than in it: the decision path
-- stays as it is, and a row outlives its lease (60 s at most) only until
-- the pruning task removes it.
CREATE TABLE lease_holder (
    lease_id    bigint PRIMARY KEY,
    key_id      bigint NOT NULL REFERENCES api_key (id) ON DELETE CASCADE,
    taken_at    timestamptz NOT NULL DEFAULT arbiter_now()
);
CREATE INDEX lease_holder_taken_at ON lease_holder (taken_at);

-- Caller-scoped admission (design.md §11): route classes, each caller's
-- token bucket, and the admissions counted per tenant and per route class in
-- windows of the class's `window_seconds`, aligned on the database clock
-- (admit_window_of()).

-- A route class: the profile a gateway names when it asks whether to admit a
-- request (`public-apis`, `partner-apis`). `burst` and `rate` (per second)
-- size each caller's bucket; `capacity` admissions per window are shared by
-- every caller of the class, and no tenant takes more than `tenant_share` of
-- them in one window. Bounded like a quota's cadence and ceiling.
CREATE TABLE route_class (
    name           text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$'),
    burst          double precision NOT NULL CHECK (burst >= 1 AND burst <= 1e9),
    rate           double precision NOT NULL CHECK (rate > 0 AND rate <= 1e6),
    capacity       bigint NOT NULL CHECK (capacity >= 1 AND capacity <= 9007199254740992),
    window_seconds integer NOT NULL CHECK (window_seconds BETWEEN 1 AND 3600
                                           AND 3600 % window_seconds = 0),
    tenant_share   double precision NOT NULL CHECK (tenant_share > 0 AND tenant_share <= 1),
    created_at     timestamptz NOT NULL DEFAULT arbiter_now(),
    updated_at     timestamptz NOT NULL DEFAULT arbiter_now()
);

-- Route classes are catalog entries like quotas and flows: audited, and
-- announced on the channel every replica listens on.
CREATE TRIGGER route_class_audit AFTER INSERT OR UPDATE OR DELETE ON route_class
    FOR EACH ROW EXECUTE FUNCTION audit_catalog_change();

-- Each caller's token bucket, keyed by a SHA-256 of who the caller is (tenant
-- and principal, or the anonymous network range) and the route class: the
-- table holds no identifier in clear, and the key is fixed-size whatever the
-- principal. The primary key is the only index the hot path uses, so ten
-- thousand callers cost one B-tree descent each.
-- UNLOGGED: a bucket is short-lived, written on every admission, and worth no
-- WAL. After a crash the table is empty and every caller starts with a full
-- bucket: at most one burst more per caller, once; the capacity and tenant
-- counts below, which protect the provider, are logged.
-- No index on full_at: with one, every bucket update was a non-HOT update
-- (a new entry in both indexes). Pruning, its only reader, runs once a minute
-- and may scan the table; the hot path updates in place (HOT), with room left
-- on each page (fillfactor 50) for the new row versions.
CREATE UNLOGGED TABLE admit_bucket (
    key         bytea PRIMARY KEY CHECK (length(key) = 32),
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    -- When the bucket is full again if nothing is spent: from then on it
    -- reads exactly like a missing one, so it can be pruned.
    full_at     timestamptz NOT NULL
) WITH (fillfactor = 50);

-- Admissions of a route class per window, and of each tenant of it. The
-- anonymous callers of a class count together under tenant '' (no tenant
-- identifier is ever made up for them).
CREATE TABLE admit_window (
    route_class  text NOT NULL REFERENCES route_class (name) ON DELETE CASCADE,
    window_start timestamptz NOT NULL,
    admitted     bigint NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    PRIMARY KEY (route_class, window_start)
);
CREATE INDEX admit_window_start ON admit_window (window_start);

CREATE TABLE admit_tenant_window (
    route_class  text NOT NULL REFERENCES route_class (name) ON DELETE CASCADE,
    tenant       text NOT NULL,
    window_start timestamptz NOT NULL,
    admitted     bigint NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    PRIMARY KEY (route_class, tenant, window_start)
);
CREATE INDEX admit_tenant_window_start ON admit_tenant_window (window_start);
