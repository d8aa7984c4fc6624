//! The leaf of the crate: the words every layer shares and the pure rules on
//! them (docs/design.md §2, §9) — outcomes and limits, merge patches, the
//! bounds of a quota's limits, roles, and rationing ([`rationing`]). It
//! imports nothing else of the crate (tests/it/layers.rs holds it to that):
//! the store, the products and HTTP build on it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

pub mod admission;
pub mod catalog;
pub mod decision;
pub mod input;
pub mod names;
pub mod ratelimit_fields;
pub mod rationing;
pub mod window;

pub use names::{FlowName, QuotaName};

/// One reading of the database clock (design.md §2: database time only): its
/// now, and the window that now falls in.
#[derive(Clone, Copy, Debug)]
pub struct ClockReading {
    pub db_now: chrono::DateTime<chrono::Utc>,
    pub window_start: chrono::DateTime<chrono::Utc>,
    pub window_end: chrono::DateTime<chrono::Utc>,
}

/// A wait in milliseconds as whole seconds, rounded up and never below 0:
/// a wait said in seconds (`Retry-After`, `retry_after_seconds`, a RateLimit
/// field's `t`) is never shorter than the real one. The one rounding of
/// every answer that says how long to wait.
pub(crate) fn seconds_rounded_up(millis: i64) -> i64 {
    (millis.max(0) + 999) / 1000
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Granted,
    /// A normal answer: try again at `retry_at`.
    Deferred,
    /// Deadline work that outranks the quota; counted after the fact.
    Bypassed,
    /// Never throttled: unknown flow, or a flow in `count` mode.
    Unthrottled,
    /// Batch items only: the store could not be reached in time, nothing was
    /// decided or spent; ask again after `retry_after_seconds`. (A single
    /// reservation answers 503 instead.)
    Unavailable,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Deferred => "deferred",
            Outcome::Bypassed => "bypassed",
            Outcome::Unthrottled => "unthrottled",
            Outcome::Unavailable => "unavailable",
        }
    }
}

/// Which limit deferred a decision (or, in observe mode, would have).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The hourly window is full: retry when the next one starts.
    Budget,
    /// The token bucket is short: retry when the tokens have refilled.
    Cadence,
    /// Every in-flight place is leased: retry when the first lease expires.
    InFlight,
}

/// Largest hourly ceiling (2^53): `count + k` can never overflow.
pub const MAX_CEILING: i64 = 1 << 53;
/// Largest cadence: refill arithmetic stays finite.
pub const MAX_RATE: f64 = 1e6;
/// Smallest cadence (one token in about 11.6 days): a refill of `rate ×
/// seconds` stays a normal double for any interval a bucket sees, where a
/// rate near the smallest double underflows, which PostgreSQL reports as an
/// error (a store failure for every decision on the quota).
pub const MIN_RATE: f64 = 1e-6;
pub const MAX_BURST: f64 = 1e9;

/// One field of a merge patch.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Patch<T> {
    /// Left out: the stored value stays.
    #[default]
    Keep,
    /// `null`: the setting is removed (a limit goes off, a setting with a
    /// default goes back to it).
    Remove,
    Set(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Option::<T>::deserialize(d)?.map_or(Patch::Remove, Patch::Set))
    }
}

/// A flag or option left out keeps the stored value.
impl<T> From<Option<T>> for Patch<T> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Patch::Keep, Patch::Set)
    }
}

impl<T> Patch<T> {
    /// The optional setting after the patch.
    pub(crate) fn applied_to(self, current: Option<T>) -> Option<T> {
        match self {
            Patch::Keep => current,
            Patch::Remove => None,
            Patch::Set(value) => Some(value),
        }
    }

    /// A setting with a default: removing it restores the default.
    pub fn or_default(self, current: T, default: T) -> T {
        match self {
            Patch::Keep => current,
            Patch::Remove => default,
            Patch::Set(value) => value,
        }
    }

    pub(crate) fn is_kept(&self) -> bool {
        matches!(self, Patch::Keep)
    }
}

/// `open`: every caller is trusted, as on a private network; `keys`: every
/// call but health, readiness and the OpenAPI document needs a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    #[default]
    Open,
    Keys,
}

/// How the connections of `database_url` reach PostgreSQL, named as
/// PgBouncer's `pool_mode`: `session` (PostgreSQL itself, or a pooler that
/// gives each client connection a server connection for as long as it
/// lasts) or `transaction` (a pooler that may hand each transaction to
/// another server connection; design.md §13).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    #[default]
    Session,
    Transaction,
}

/// Ordered: each role may do what the ones below it may. An operator only
/// reads; a worker spends quota and also reads the views of what it spends;
/// an admin does everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Operator,
    Worker,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "worker" => Ok(Role::Worker),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role `{other}` (worker, operator or admin)"
            )),
        }
    }
}

/// What a route needs in `keys` mode: declared by the group of routes it is
/// in (`http::documented_routes`), never matched from its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Probes and the API description: no key.
    Open,
    AtLeast(Role),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_in_seconds_is_never_shorter_than_the_real_one() {
        for (millis, seconds) in [
            (-5_000, 0),
            (0, 0),
            (1, 1),
            (999, 1),
            (1_000, 1),
            (1_001, 2),
            (3_599_500, 3_600),
        ] {
            assert_eq!(seconds_rounded_up(millis), seconds, "{millis} ms");
        }
    }
}

/// A value that must never reach a log line: Debug prints it redacted (a
/// database URL keeps its host and database so operators can still tell which).
#[derive(Clone, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl<'de> Deserialize<'de> for Secret {
    /// Environment values that look like numbers arrive as numbers; a token
    /// of digits is still a token.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Signed(i64),
            Unsigned(u64),
        }
        Ok(Secret(match Raw::deserialize(d)? {
            Raw::Text(text) => text,
            Raw::Signed(n) => n.to_string(),
            Raw::Unsigned(n) => n.to_string(),
        }))
    }
}

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once("://") {
            Some((scheme, rest)) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                write!(f, "{scheme}://[redacted]@{host}")
            }
            None => f.write_str("[redacted]"),
        }
    }
}
