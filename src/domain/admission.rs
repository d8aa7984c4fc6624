//! Caller-scoped admission (design.md §11): the rules, pure. A gateway asks
//! `/v1/admit` before letting a request of one of its callers through; the
//! answer depends on the caller's own bucket, its tenant's share of the route
//! class's capacity, and that capacity. The store's one statement
//! (sql/admit.sql) does the atomic part; what a route class may be, who the
//! caller is, how much a tenant may take, and what the answer says (status,
//! `Retry-After`, the RateLimit fields) are decided here.

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::domain::ratelimit_fields::{self, whole_seconds};
use crate::domain::{Patch, MAX_BURST, MAX_CEILING, MAX_RATE, MIN_RATE};

/// Window lengths a route class may count capacity in: the divisors of an
/// hour, so windows stay aligned on the UTC hour.
pub(crate) const WINDOW_SECONDS: [i32; 45] = [
    1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15, 16, 18, 20, 24, 25, 30, 36, 40, 45, 48, 50, 60, 72, 75, 80,
    90, 100, 120, 144, 150, 180, 200, 225, 240, 300, 360, 400, 450, 600, 720, 900, 1200, 1800,
    3600,
];

/// A route class's settings, as `PUT /v1/route-classes/{name}` and a config
/// file's `[route_classes.NAME]` declare them: every field is required.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteClassSettings {
    /// Each caller's bucket size: how many requests at once after a quiet spell.
    #[schema(minimum = 1, maximum = 1e9)]
    pub burst: f64,
    /// Each caller's sustained rate, requests per second.
    #[schema(minimum = 1e-6, maximum = 1e6)]
    pub rate: f64,
    /// Admissions per window shared by every caller of the class.
    #[schema(minimum = 1, maximum = 9007199254740992_i64)]
    #[serde(deserialize_with = "crate::domain::input::integer::required")]
    pub capacity: i64,
    /// The window's length in seconds; it divides an hour (windows are
    /// aligned on the hour of the database clock).
    #[schema(schema_with = window_seconds_schema)]
    #[serde(deserialize_with = "crate::domain::input::integer::required")]
    pub window_seconds: i32,
    /// The most of `capacity` one tenant may take in a window, in (0, 1].
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub tenant_share: f64,
    /// The share of the class's admissions that may be refused for
    /// capacity before the alert says its capacity is too small, in (0, 1]
    /// (default 0.01).
    #[schema(exclusive_minimum = 0, maximum = 1, default = 0.01)]
    #[serde(default = "default_capacity_error_budget")]
    pub capacity_error_budget: f64,
}

/// A route class's error budget for capacity refusals until one is set: 1 %.
pub const DEFAULT_CAPACITY_ERROR_BUDGET: f64 = 0.01;

fn default_capacity_error_budget() -> f64 {
    DEFAULT_CAPACITY_ERROR_BUDGET
}

fn window_seconds_schema() -> utoipa::openapi::schema::Schema {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Integer)
        .enum_values(Some(WINDOW_SECONDS))
        .into()
}

impl RouteClassSettings {
    /// The checks every route class passes, whichever surface wrote it (the
    /// table's CHECKs say the same).
    pub(crate) fn validated(self) -> Result<Self, String> {
        if !(self.burst >= 1.0 && self.burst <= MAX_BURST) {
            return Err(format!("`burst` must be between 1 and {MAX_BURST}"));
        }
        if !(MIN_RATE..=MAX_RATE).contains(&self.rate) {
            return Err(format!(
                "`rate` must be between {MIN_RATE} and {MAX_RATE} per second"
            ));
        }
        if !(1..=MAX_CEILING).contains(&self.capacity) {
            return Err(format!("`capacity` must be between 1 and {MAX_CEILING}"));
        }
        if !WINDOW_SECONDS.contains(&self.window_seconds) {
            return Err(
                "`window_seconds` must divide an hour (1, 2, 3, … 60, … 900, 1800, 3600)".into(),
            );
        }
        if !(self.tenant_share > 0.0 && self.tenant_share <= 1.0) {
            return Err("`tenant_share` must be above 0 and at most 1".into());
        }
        if !(self.capacity_error_budget > 0.0 && self.capacity_error_budget <= 1.0) {
            return Err("`capacity_error_budget` must be above 0 and at most 1".into());
        }
        Ok(self)
    }

    /// The most admissions one tenant may take in a window: its share of the
    /// capacity, rounded down, but at least one (a share too small to admit
    /// anybody would close the class without saying so).
    pub(crate) fn tenant_allowance(&self) -> i64 {
        // The nudge keeps 0.29 × 100 at 29, not 28.999….
        let share = (self.capacity as f64 * self.tenant_share * (1.0 + 1e-12)).floor();
        (share as i64).clamp(1, self.capacity)
    }
}

/// `PATCH /v1/route-classes/{name}`: only the fields given change (JSON merge
/// patch). Every setting of a route class is required, so none can be removed:
/// a `null` is refused.
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteClassPatch {
    #[serde(default)]
    #[schema(value_type = f64, minimum = 1, maximum = 1e9)]
    pub burst: Patch<f64>,
    #[serde(default)]
    #[schema(value_type = f64, exclusive_minimum = 0, maximum = 1e6)]
    pub rate: Patch<f64>,
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = i64, minimum = 1, maximum = 9007199254740992_i64)]
    pub capacity: Patch<i64>,
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = i32, schema_with = window_seconds_schema)]
    pub window_seconds: Patch<i32>,
    #[serde(default)]
    #[schema(value_type = f64, exclusive_minimum = 0, maximum = 1)]
    pub tenant_share: Patch<f64>,
    #[serde(default)]
    #[schema(value_type = f64, exclusive_minimum = 0, maximum = 1)]
    pub capacity_error_budget: Patch<f64>,
}

impl RouteClassPatch {
    /// The settings after the patch, checked like a whole class.
    pub(crate) fn applied_to(
        self,
        current: RouteClassSettings,
    ) -> Result<RouteClassSettings, String> {
        fn field<T>(patch: Patch<T>, current: T, name: &str) -> Result<T, String> {
            match patch {
                Patch::Keep => Ok(current),
                Patch::Set(value) => Ok(value),
                Patch::Remove => Err(format!(
                    "`{name}` cannot be removed: every setting of a route class is required"
                )),
            }
        }
        RouteClassSettings {
            burst: field(self.burst, current.burst, "burst")?,
            rate: field(self.rate, current.rate, "rate")?,
            capacity: field(self.capacity, current.capacity, "capacity")?,
            window_seconds: field(
                self.window_seconds,
                current.window_seconds,
                "window_seconds",
            )?,
            tenant_share: field(self.tenant_share, current.tenant_share, "tenant_share")?,
            // The one setting with a default: `null` restores it.
            capacity_error_budget: match self.capacity_error_budget {
                Patch::Remove => DEFAULT_CAPACITY_ERROR_BUDGET,
                budget => field(budget, current.capacity_error_budget, "")?,
            },
        }
        .validated()
    }
}

/// A route class as the catalog holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteClass {
    pub name: String,
    pub settings: RouteClassSettings,
}

/// Who is asking to be let through, as the gateway vouches for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A caller the gateway authenticated.
    Principal { tenant: String, principal: String },
    /// An unauthenticated caller: only its network range (/24 for IPv4, /64
    /// for IPv6) is known, never a tenant.
    Anonymous { network: String },
}

impl Caller {
    /// A caller from what the gateway sent: principal and tenant both or
    /// neither; neither is the anonymous class of `address`'s network.
    pub(crate) fn identify(
        principal: Option<&str>,
        tenant: Option<&str>,
        address: Option<IpAddr>,
    ) -> Result<Self, String> {
        match (principal, tenant) {
            (Some(principal), Some(tenant)) => {
                identifier(principal).map_err(|why| format!("the principal {why}"))?;
                identifier(tenant).map_err(|why| format!("the tenant {why}"))?;
                Ok(Caller::Principal {
                    tenant: tenant.to_string(),
                    principal: principal.to_string(),
                })
            }
            (None, None) => match address {
                Some(address) => Ok(Caller::Anonymous {
                    network: network_of(address),
                }),
                None => Err("the caller's address is unknown: the configured client address header is missing or not an IP address".into()),
            },
            _ => Err("a principal and its tenant go together: give both, or neither for an anonymous caller".into()),
        }
    }

    /// The key of this caller's bucket in `route_class`: a SHA-256, so the
    /// store holds no identifier in clear. The parts are length-prefixed, so
    /// no two callers share a key by where their parts are split.
    pub fn bucket_key(&self, route_class: &str) -> [u8; 32] {
        let mut hash = Sha256::new();
        let mut part = |text: &str| {
            hash.update((text.len() as u64).to_be_bytes());
            hash.update(text.as_bytes());
        };
        match self {
            Caller::Principal { tenant, principal } => {
                part("principal");
                part(tenant);
                part(principal);
            }
            Caller::Anonymous { network } => {
                part("anonymous");
                part(network);
            }
        }
        part(route_class);
        hash.finalize().into()
    }

    /// Whose share of the capacity an admission counts against: the tenant,
    /// or for anonymous callers their group as a whole (`""`, no tenant's).
    pub(crate) fn tenant_group(&self) -> &str {
        match self {
            Caller::Principal { tenant, .. } => tenant,
            Caller::Anonymous { .. } => "",
        }
    }
}

/// A principal or tenant identifier: printable, 1 to 256 characters.
fn identifier(value: &str) -> Result<(), String> {
    crate::domain::input::reference(value)
}

/// The network range a caller is counted in: /24 for IPv4, /64 for IPv6 (an
/// IPv4 address written as IPv6, `::ffff:a.b.c.d`, is IPv4).
pub(crate) fn network_of(address: IpAddr) -> String {
    match address.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0/24")
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let prefix = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
            format!("{prefix}/64")
        }
    }
}

/// The client address in a trusted forwarding header: the last entry of
/// `X-Forwarded-For` (the one the trusted proxy added; entries before it are
/// whatever the client wrote), or the single value of `X-Real-IP` and the
/// like. An entry may carry a port (`203.0.113.7:4711`, `[2001:db8::1]:443`).
pub(crate) fn forwarded_address(value: &str) -> Option<IpAddr> {
    let last = value.rsplit(',').next()?.trim();
    if let Ok(address) = last.parse::<IpAddr>() {
        return Some(address);
    }
    if let Ok(socket) = last.parse::<std::net::SocketAddr>() {
        return Some(socket.ip());
    }
    last.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Why the store refused an admission (`refused_by` of sql/admit.sql).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The caller's own bucket is empty.
    Caller,
    /// The caller's tenant has taken its share of this window's capacity.
    TenantShare,
    /// The route class's capacity for this window is taken.
    Capacity,
}

impl Refusal {
    pub(crate) fn from_store(refused_by: &str) -> Option<Self> {
        match refused_by {
            "caller" => Some(Refusal::Caller),
            "tenant_share" => Some(Refusal::TenantShare),
            "capacity" => Some(Refusal::Capacity),
            _ => None,
        }
    }
}

/// What an admission answered: the `outcome` label of `quota_admit_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Admitted,
    /// 429: the caller's own limit.
    CallerRateLimited,
    /// 503: the tenant's share or the shared capacity; the provider's limit.
    CapacityExhausted,
    /// 503: the store did not answer in time; nobody is admitted (fail closed).
    StoreUnavailable,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Admitted,
        Outcome::CallerRateLimited,
        Outcome::CapacityExhausted,
        Outcome::StoreUnavailable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::CallerRateLimited => "caller_rate_limited",
            Outcome::CapacityExhausted => "capacity_exhausted",
            Outcome::StoreUnavailable => "store_unavailable",
        }
    }
}

/// What the store answered for one admission.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Admission {
    pub refused_by: Option<Refusal>,
    /// The caller's bucket after the decision (refilled to now; one token
    /// less when admitted).
    pub tokens: f64,
    pub db_now: DateTime<Utc>,
    pub window_end: DateTime<Utc>,
}

/// The answer to a caller, decided from its own bucket only.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub outcome: Outcome,
    /// Seconds to wait: 429, until the caller's next token; 503 capacity,
    /// until the window ends. `None` when it cannot be computed.
    pub retry_after: Option<u64>,
    /// The caller's bucket as the RateLimit fields describe it.
    pub limit: CallerLimit,
}

/// The caller's own bucket in the terms of the RateLimit fields
/// (draft-ietf-httpapi-ratelimit-headers-12): `r`, what it may still send at
/// once, and `t`, the seconds until that grows (none when the bucket is full).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerLimit {
    pub remaining: u64,
    pub reset: Option<u64>,
}

/// The answer to an admission the store decided.
pub fn verdict(class: &RouteClassSettings, admission: &Admission) -> Verdict {
    let limit = caller_limit(class, admission.tokens);
    let (outcome, retry_after) = match admission.refused_by {
        None => (Outcome::Admitted, None),
        // The wait until the next token is exactly the RateLimit field's `t`
        // (r = 0): the two can never disagree.
        Some(Refusal::Caller) => (Outcome::CallerRateLimited, limit.reset),
        Some(Refusal::TenantShare | Refusal::Capacity) => {
            let left = (admission.window_end - admission.db_now).num_milliseconds() as f64 / 1e3;
            (Outcome::CapacityExhausted, whole_seconds(left))
        }
    };
    Verdict {
        outcome,
        retry_after,
        limit,
    }
}

/// `r` and `t` of a bucket holding `tokens` of `class`'s burst.
pub(crate) fn caller_limit(class: &RouteClassSettings, tokens: f64) -> CallerLimit {
    let tokens = if tokens.is_finite() {
        tokens.clamp(0.0, class.burst)
    } else {
        0.0
    };
    let whole = tokens.floor();
    let next = whole + 1.0;
    // A bucket that cannot reach the next whole token is as full as it gets.
    let reset = if next <= class.burst {
        whole_seconds((next - tokens) / class.rate)
    } else {
        None
    };
    CallerLimit {
        remaining: whole as u64,
        reset,
    }
}

/// The `RateLimit-Policy` field: the caller's bucket as a quota policy named
/// after the route class: `q` requests (the burst) per `w` seconds (the time
/// the rate takes to refill a whole burst).
pub(crate) fn policy_field(class: &RouteClass) -> String {
    let settings = &class.settings;
    let window = whole_seconds(settings.burst / settings.rate).unwrap_or(u64::MAX);
    ratelimit_fields::policy_field(&class.name, settings.burst.floor() as u64, window)
}

/// The `RateLimit` field: what the caller may still send and when that grows.
pub(crate) fn limit_field(class: &RouteClass, limit: CallerLimit) -> String {
    ratelimit_fields::limit_field(&class.name, limit.remaining, limit.reset)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn class(burst: f64, rate: f64) -> RouteClassSettings {
        RouteClassSettings {
            burst,
            rate,
            capacity: 600,
            window_seconds: 60,
            tenant_share: 0.5,
            capacity_error_budget: 0.01,
        }
    }

    fn admission(refused_by: Option<Refusal>, tokens: f64) -> Admission {
        let db_now = "2026-11-30T10:00:12.250Z".parse().unwrap();
        Admission {
            refused_by,
            tokens,
            db_now,
            window_end: "2026-11-30T10:01:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn settings_are_checked_like_the_table() {
        assert!(class(20.0, 5.0).validated().is_ok());
        for bad in [
            class(0.5, 5.0),
            class(20.0, 0.0),
            class(f64::NAN, 5.0),
            RouteClassSettings {
                window_seconds: 7,
                ..class(20.0, 5.0)
            },
            RouteClassSettings {
                tenant_share: 0.0,
                ..class(20.0, 5.0)
            },
            RouteClassSettings {
                tenant_share: 1.01,
                ..class(20.0, 5.0)
            },
            RouteClassSettings {
                capacity_error_budget: 0.0,
                ..class(20.0, 5.0)
            },
            RouteClassSettings {
                capacity_error_budget: 1.5,
                ..class(20.0, 5.0)
            },
            RouteClassSettings {
                capacity: 0,
                ..class(20.0, 5.0)
            },
        ] {
            assert!(bad.clone().validated().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_patch_changes_only_what_it_names_and_removes_nothing() {
        let stored = class(20.0, 5.0);
        let patch: RouteClassPatch = serde_json::from_str(r#"{"capacity": 900}"#).unwrap();
        let after = patch.applied_to(stored.clone()).unwrap();
        assert_eq!(
            after,
            RouteClassSettings {
                capacity: 900,
                ..stored.clone()
            }
        );
        let removed: RouteClassPatch = serde_json::from_str(r#"{"rate": null}"#).unwrap();
        assert!(removed.applied_to(stored.clone()).is_err());
        let bad: RouteClassPatch = serde_json::from_str(r#"{"window_seconds": 7}"#).unwrap();
        assert!(bad.applied_to(stored).is_err());
    }

    #[test]
    fn every_window_length_divides_an_hour_and_every_divisor_is_one() {
        let divisors: Vec<i32> = (1..=3600).filter(|s| 3600 % s == 0).collect();
        assert_eq!(WINDOW_SECONDS.to_vec(), divisors);
    }

    #[test]
    fn a_tenant_takes_its_share_rounded_down_but_at_least_one() {
        let share = |capacity, tenant_share| {
            RouteClassSettings {
                capacity,
                tenant_share,
                ..class(1.0, 1.0)
            }
            .tenant_allowance()
        };
        assert_eq!(share(600, 0.5), 300);
        assert_eq!(share(100, 0.29), 29);
        assert_eq!(share(10, 0.25), 2);
        assert_eq!(share(1, 0.5), 1);
        assert_eq!(share(600, 1.0), 600);
    }

    #[test]
    fn an_empty_bucket_is_a_429_whose_wait_is_the_next_token() {
        // 0.25 token, 0.5 token/s: the next one in 1.5 s, said as 2.
        let verdict = verdict(&class(3.0, 0.5), &admission(Some(Refusal::Caller), 0.25));
        assert_eq!(verdict.outcome, Outcome::CallerRateLimited);
        assert_eq!(verdict.retry_after, Some(2));
        assert_eq!(
            verdict.limit,
            CallerLimit {
                remaining: 0,
                reset: Some(2)
            }
        );
    }

    #[test]
    fn the_providers_limit_is_a_503_until_the_window_ends() {
        for refusal in [Refusal::TenantShare, Refusal::Capacity] {
            let verdict = verdict(&class(3.0, 0.5), &admission(Some(refusal), 2.5));
            assert_eq!(verdict.outcome, Outcome::CapacityExhausted);
            assert_eq!(verdict.retry_after, Some(48), "47.75 s left, rounded up");
            assert_eq!(verdict.limit.remaining, 2, "the caller's own bucket");
        }
    }

    #[test]
    fn an_admission_says_what_is_left_and_a_full_bucket_no_reset() {
        let admitted = verdict(&class(20.0, 5.0), &admission(None, 19.0));
        assert_eq!(admitted.outcome, Outcome::Admitted);
        assert_eq!(admitted.retry_after, None);
        assert_eq!(
            admitted.limit,
            CallerLimit {
                remaining: 19,
                reset: Some(1)
            }
        );
        assert_eq!(caller_limit(&class(20.0, 5.0), 20.0).reset, None);
        assert_eq!(caller_limit(&class(20.5, 5.0), 20.2).reset, None);
    }

    #[test]
    fn the_fields_follow_the_draft_syntax() {
        let public = RouteClass {
            name: "public-apis".into(),
            settings: class(20.0, 5.0),
        };
        assert_eq!(policy_field(&public), "\"public-apis\";q=20;w=4");
        let limit = CallerLimit {
            remaining: 0,
            reset: Some(3),
        };
        assert_eq!(limit_field(&public, limit), "\"public-apis\";r=0;t=3");
        let full = CallerLimit {
            remaining: 20,
            reset: None,
        };
        assert_eq!(limit_field(&public, full), "\"public-apis\";r=20");
    }

    #[test]
    fn networks_are_a_24_and_a_64() {
        let net = |s: &str| network_of(s.parse().unwrap());
        assert_eq!(net("203.0.113.7"), "203.0.113.0/24");
        assert_eq!(net("203.0.113.200"), "203.0.113.0/24");
        assert_eq!(net("::ffff:203.0.113.9"), "203.0.113.0/24");
        assert_eq!(net("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
        assert_ne!(net("203.0.114.7"), net("203.0.113.7"));
    }

    #[test]
    fn the_trusted_proxys_entry_is_the_last() {
        let at = |s: &str| forwarded_address(s).map(|a| a.to_string());
        assert_eq!(
            at("198.51.100.1, 203.0.113.7").as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(at("203.0.113.7:4711").as_deref(), Some("203.0.113.7"));
        assert_eq!(at("[2001:db8::1]:443").as_deref(), Some("2001:db8::1"));
        assert_eq!(at("2001:db8::1").as_deref(), Some("2001:db8::1"));
        assert_eq!(at("unknown"), None);
        assert_eq!(at(""), None);
    }

    #[test]
    fn a_caller_is_both_principal_and_tenant_or_anonymous() {
        let ip = Some("203.0.113.7".parse().unwrap());
        assert!(Caller::identify(Some("alice"), None, ip).is_err());
        assert!(Caller::identify(None, Some("acme"), ip).is_err());
        assert!(Caller::identify(Some("a\nb"), Some("acme"), ip).is_err());
        assert!(Caller::identify(None, None, None).is_err());
        let anonymous = Caller::identify(None, None, ip).unwrap();
        assert_eq!(anonymous.tenant_group(), "");
        let alice = Caller::identify(Some("alice"), Some("acme"), ip).unwrap();
        assert_eq!(alice.tenant_group(), "acme");
    }

    #[test]
    fn bucket_keys_part_callers_and_classes() {
        let who = |p: &str, t: &str| Caller::Principal {
            principal: p.into(),
            tenant: t.into(),
        };
        let keys = [
            who("ab", "c").bucket_key("public"),
            who("a", "bc").bucket_key("public"),
            who("ab", "c").bucket_key("partner"),
            Caller::Anonymous {
                network: "203.0.113.0/24".into(),
            }
            .bucket_key("public"),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(who("ab", "c").bucket_key("public"), keys[0]);
    }

    proptest! {
        /// Whatever the bucket, a 429's Retry-After is the RateLimit field's
        /// `t` with nothing left, and no answer promises more than the burst.
        #[test]
        fn retry_after_and_the_ratelimit_field_agree(
            burst in 1.0f64..1e4,
            rate in 1e-3f64..1e3,
            fill in 0.0f64..1.0,
            refused in prop::sample::select(vec![None, Some(Refusal::Caller), Some(Refusal::Capacity)]),
        ) {
            let settings = class(burst, rate);
            let tokens = match refused {
                Some(Refusal::Caller) => fill.min(0.999),
                _ => fill * burst,
            };
            let verdict = verdict(&settings, &admission(refused, tokens));
            prop_assert!(verdict.limit.remaining as f64 <= burst);
            match verdict.outcome {
                Outcome::CallerRateLimited => {
                    prop_assert_eq!(verdict.limit.remaining, 0);
                    prop_assert!(verdict.retry_after.is_some());
                    prop_assert_eq!(verdict.retry_after, verdict.limit.reset);
                    // Waiting that long brings the next token.
                    let waited = tokens + rate * verdict.retry_after.unwrap() as f64;
                    prop_assert!(waited >= 1.0 - 1e-9);
                }
                Outcome::Admitted => prop_assert_eq!(verdict.retry_after, None),
                Outcome::CapacityExhausted => prop_assert_eq!(verdict.retry_after, Some(48)),
                Outcome::StoreUnavailable => prop_assert!(false, "not from the store's answer"),
            }
        }

        /// A tenant never gets more than its share (or the one it is always
        /// given), and never more than the capacity.
        #[test]
        fn a_tenant_allowance_stays_within_its_share(
            capacity in 1i64..1_000_000,
            share in 1e-6f64..=1.0,
        ) {
            let settings = RouteClassSettings { capacity, tenant_share: share, ..class(1.0, 1.0) };
            let allowance = settings.tenant_allowance();
            prop_assert!(allowance >= 1 && allowance <= capacity);
            prop_assert!(allowance == 1 || allowance as f64 <= capacity as f64 * share * (1.0 + 1e-9));
        }

        /// Two addresses share a bucket exactly when they share a /24.
        #[test]
        fn ipv4_callers_share_a_bucket_within_a_24(a: [u8; 4], b: [u8; 4]) {
            let caller = |o: [u8; 4]| Caller::Anonymous { network: network_of(IpAddr::from(o)) };
            let same = caller(a).bucket_key("public") == caller(b).bucket_key("public");
            prop_assert_eq!(same, a[..3] == b[..3]);
        }
    }
}
