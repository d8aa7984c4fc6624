//! Configuration: serialized defaults < TOML file (`QUOTA_CONFIG`, else
//! `quota-arbiter.toml` when present) < environment.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::domain::admission::RouteClassSettings;
use crate::domain::catalog::{FlowSeed, QuotaLimits};
use crate::domain::Secret;
use crate::domain::{AuthMode, PoolMode};

pub(crate) const DEFAULT_CONFIG_FILE: &str = "quota-arbiter.toml";

/// Keys read from `QUOTA_<KEY>` environment variables.
const ENV_KEYS: &[&str] = &[
    "database_pool_mode",
    "direct_database_url",
    "listen",
    "hourly_ceiling",
    "bypass_horizon",
    "admin_token",
    "log_format",
    "migrate_on_start",
    "store_timeout",
    "max_connections",
    "lease_duration",
    "settle_within",
    "catalog_stale_after",
    "work_retention",
    "history_retention",
    "audit_retention",
    "auth",
    "admit_client_ip_header",
];

/// `QUOTA_*` variables that belong to others on the same machine: the file
/// path read before the layers, and the worker client's settings.
const OTHER_QUOTA_VARS: &[&str] = &[
    "QUOTA_CONFIG",
    "QUOTA_ARBITER_URL",
    "QUOTA_ARBITER_KEY",
    "QUOTA_CLIENT_RATE",
    "QUOTA_CLIENT_BURST",
    "QUOTA_RETRY_ATTEMPTS",
    "QUOTA_RETRY_BASE",
    "QUOTA_RETRY_MAX",
];

/// `QUOTA_*` variables that configure nothing, each with why it is named: a
/// typo (`QUOTA_HOURLY_CEILNG`) is otherwise ignored without a word. Service
/// links a platform injects (Kubernetes: `QUOTA_SERVICE_HOST`,
/// `QUOTA_ARBITER_PORT_8080_TCP`, …) and the client's variables are not named.
pub fn ignored_env_vars(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let known: Vec<String> = ENV_KEYS
        .iter()
        .map(|key| format!("QUOTA_{}", key.to_uppercase()))
        .collect();
    let mut ignored: Vec<String> = names
        .into_iter()
        .filter(|name| name.starts_with("QUOTA_"))
        .filter(|name| !known.contains(name) && !OTHER_QUOTA_VARS.contains(&name.as_str()))
        .filter(|name| !is_service_link(name))
        .map(|name| {
            let closest = known.iter().min_by_key(|key| edit_distance(key, &name));
            match closest.filter(|key| edit_distance(key, &name) <= 3) {
                Some(key) => {
                    format!("{name} is not a setting and is ignored (did you mean {key}?)")
                }
                None => format!("{name} is not a setting and is ignored"),
            }
        })
        .collect();
    ignored.sort();
    ignored
}

/// Docker-style service links and service variables, as Kubernetes injects
/// them for every service: `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<NAME>]`,
/// `<SVC>_PORT`, `<SVC>_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]`.
fn is_service_link(name: &str) -> bool {
    if name.ends_with("_SERVICE_HOST")
        || name.ends_with("_SERVICE_PORT")
        || name.contains("_SERVICE_PORT_")
        || name.ends_with("_PORT")
    {
        return true;
    }
    name.match_indices("_PORT_").any(|(at, _)| {
        let mut parts = name[at + 6..].split('_');
        let port = parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        let protocol = parts
            .next()
            .is_some_and(|p| ["TCP", "UDP", "SCTP"].contains(&p));
        let rest: Vec<_> = parts.collect();
        port && protocol
            && (rest.is_empty()
                || (rest.len() == 1 && ["PROTO", "PORT", "ADDR"].contains(&rest[0])))
    })
}

/// Levenshtein distance, for "did you mean" on a typo'd variable.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub database_url: Secret,
    /// How `database_url`'s connections reach PostgreSQL, as PgBouncer's
    /// `pool_mode` says: `session` (PostgreSQL itself, or a session pooler)
    /// or `transaction` (design.md §13).
    pub database_pool_mode: PoolMode,
    /// PostgreSQL itself, past any pooler: migrations and the connection
    /// that listens for catalog changes use it. Unset: `database_url` in
    /// session pool mode; in transaction pool mode, no listener (the catalog
    /// is polled) and no migrations at start.
    #[serde(default)]
    pub direct_database_url: Option<Secret>,
    pub listen: SocketAddr,
    /// Ceiling of a quota that names none.
    pub hourly_ceiling: i64,
    /// Work whose deadline is this close is granted as `bypassed`.
    #[serde(with = "humantime_serde_compat")]
    pub bypass_horizon: Duration,
    pub admin_token: Option<Secret>,
    /// `open` (every caller trusted: a private network) or `keys` (API keys
    /// and roles, design.md §4).
    pub auth: AuthMode,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// Apply migrations when `serve` starts.
    pub migrate_on_start: bool,
    /// Upper bound on how long an enforced decision waits for the store before
    /// answering 503; kept under the 2 s promised by design.md §3.4.
    #[serde(with = "humantime_serde_compat")]
    pub store_timeout: Duration,
    pub max_connections: u32,
    /// How long a claimed work item is leased; after that it is pending again.
    #[serde(with = "humantime_serde_compat")]
    pub lease_duration: Duration,
    /// How long a reservation with an estimate may be settled (`POST
    /// /v1/settle`); after that it stays spent as estimated.
    #[serde(with = "humantime_serde_compat")]
    pub settle_within: Duration,
    /// How old the replica's catalog and key ring may grow (their reloads
    /// failing) before it is not ready and enforced decisions fail closed.
    #[serde(with = "humantime_serde_compat")]
    pub catalog_stale_after: Duration,
    /// How long done work items are kept before they are pruned; 0: forever.
    #[serde(with = "humantime_serde_compat")]
    pub work_retention: Duration,
    /// How long hourly windows and decision tallies are kept; 0: forever.
    #[serde(with = "humantime_serde_compat")]
    pub history_retention: Duration,
    /// How long the catalog audit trail is kept; 0: forever.
    #[serde(with = "humantime_serde_compat")]
    pub audit_retention: Duration,
    /// Admission: the trusted forwarding header an anonymous caller's
    /// address is read from (`X-Forwarded-For`: its last entry, the one the
    /// trusted proxy added; `X-Real-IP`). Unset: the peer's address. Set it
    /// only behind a proxy that sets or appends it, or callers choose their
    /// own network.
    #[serde(default)]
    pub admit_client_ip_header: Option<String>,
    #[serde(default)]
    pub quotas: BTreeMap<String, QuotaLimits>,
    #[serde(default)]
    pub flows: BTreeMap<String, FlowSeed>,
    /// Route classes seeded at start-up (admission profiles, design.md §11).
    #[serde(default)]
    pub route_classes: BTreeMap<String, RouteClassSettings>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database_url: Secret("postgres://localhost/quota_arbiter".into()),
            database_pool_mode: PoolMode::Session,
            direct_database_url: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            hourly_ceiling: 1000,
            bypass_horizon: Duration::from_secs(15 * 60),
            admin_token: None,
            auth: AuthMode::Open,
            log_format: LogFormat::Text,
            migrate_on_start: true,
            store_timeout: Duration::from_millis(1500),
            max_connections: 16,
            lease_duration: Duration::from_secs(5 * 60),
            settle_within: Duration::from_secs(10 * 60),
            catalog_stale_after: crate::catalog::DEFAULT_STALE_AFTER,
            work_retention: Duration::from_secs(7 * 24 * 3600),
            history_retention: Duration::from_secs(90 * 24 * 3600),
            audit_retention: Duration::ZERO,
            admit_client_ip_header: None,
            quotas: BTreeMap::new(),
            flows: BTreeMap::new(),
            route_classes: BTreeMap::new(),
        }
    }
}

impl Config {
    /// Loads the layered configuration from the process environment.
    pub fn load() -> Result<Self, ConfigError> {
        let file = std::env::var_os("QUOTA_CONFIG").map(PathBuf::from);
        Self::figment(file.as_deref())
            .extract::<Self>()
            .map_err(ConfigError::from)
            .and_then(Self::validated)
    }

    /// The layers, exposed so tests can inspect where a value came from.
    pub fn figment(file: Option<&Path>) -> Figment {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE))
            }
            None => {}
        }
        figment
            .merge(Env::raw().only(&["DATABASE_URL"]))
            // Only the keys we own: orchestrators inject QUOTA_* variables of
            // their own (a service named quota-arbiter gets QUOTA_ARBITER_PORT).
            .merge(Env::prefixed("QUOTA_").only(ENV_KEYS))
    }

    /// Where a session of its own can be had (migrations, LISTEN, operator
    /// commands): `direct_database_url`, else `database_url` when its
    /// sessions last; with the key it came from.
    pub fn session_url(&self) -> Option<(&'static str, &Secret)> {
        match (&self.direct_database_url, self.database_pool_mode) {
            (Some(url), _) => Some(("direct_database_url", url)),
            (None, PoolMode::Session) => Some(("database_url", &self.database_url)),
            (None, PoolMode::Transaction) => None,
        }
    }

    fn validated(mut self) -> Result<Self, ConfigError> {
        // An empty token would enable an admin API nobody can call.
        if self
            .admin_token
            .as_ref()
            .is_some_and(|t| t.expose().is_empty())
        {
            self.admin_token = None;
        }
        let invalid = |key: &str, why: String| ConfigError::Invalid {
            key: key.to_string(),
            why,
        };
        crate::domain::catalog::validate_ceiling("hourly_ceiling", self.hourly_ceiling)
            .map_err(|why| invalid("hourly_ceiling", why))?;
        if self.store_timeout > Duration::from_millis(1900) || self.store_timeout.is_zero() {
            return Err(invalid(
                "store_timeout",
                "must be above 0 and at most 1.9s (503 within 2 s)".into(),
            ));
        }
        if self.settle_within < Duration::from_secs(1) {
            return Err(invalid("settle_within", "must be at least 1s".into()));
        }
        if self.catalog_stale_after < Duration::from_secs(3) {
            return Err(invalid(
                "catalog_stale_after",
                "must be at least 3s (the catalog is synced every 2 s)".into(),
            ));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(invalid("lease_duration", "must be at least 1s".into()));
        }
        if self.database_pool_mode == PoolMode::Transaction
            && self.migrate_on_start
            && self.direct_database_url.is_none()
        {
            return Err(invalid(
                "direct_database_url",
                "is needed to migrate on start when database_pool_mode is transaction \
                 (migrations hold a session lock a transaction pooler cannot keep): set it \
                 to PostgreSQL itself, or set migrate_on_start = false and run \
                 `quota-arbiter migrate` with DATABASE_URL pointing at PostgreSQL"
                    .into(),
            ));
        }
        if self.max_connections == 0 {
            return Err(invalid("max_connections", "must be at least 1".into()));
        }
        for (name, quota) in &self.quotas {
            crate::domain::catalog::validate_name(name)
                .map_err(|why| invalid(&format!("quotas.{name}"), why))?;
            quota
                .settings(self.hourly_ceiling)
                .map_err(|why| invalid(&format!("quotas.{name}"), why))?;
        }
        if let Some(header) = &self.admit_client_ip_header {
            axum::http::HeaderName::try_from(header.as_str()).map_err(|_| {
                invalid(
                    "admit_client_ip_header",
                    format!("`{header}` is not a header name"),
                )
            })?;
        }
        for (name, class) in &self.route_classes {
            crate::domain::catalog::validate_name(name)
                .map_err(|why| invalid(&format!("route_classes.{name}"), why))?;
            class
                .clone()
                .validated()
                .map_err(|why| invalid(&format!("route_classes.{name}"), why))?;
        }
        for (name, flow) in &self.flows {
            crate::domain::catalog::validate_name(name)
                .map_err(|why| invalid(&format!("flows.{name}"), why))?;
            let quotas = flow
                .quotas()
                .map_err(|why| invalid(&format!("flows.{name}.quotas"), why))?;
            if quotas.len() > crate::domain::catalog::MAX_FLOW_QUOTAS {
                return Err(invalid(
                    &format!("flows.{name}.quotas"),
                    format!(
                        "a flow spends at most {} quotas",
                        crate::domain::catalog::MAX_FLOW_QUOTAS
                    ),
                ));
            }
            if flow.priority.is_some_and(|p| !(1..=9).contains(&p)) {
                return Err(invalid(
                    &format!("flows.{name}.priority"),
                    "must be between 1 and 9".into(),
                ));
            }
        }
        Ok(self)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("database_url", &self.database_url)
            .field("database_pool_mode", &self.database_pool_mode)
            .field("direct_database_url", &self.direct_database_url)
            .field("listen", &self.listen)
            .field("hourly_ceiling", &self.hourly_ceiling)
            .field("bypass_horizon", &self.bypass_horizon)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "[redacted]"),
            )
            .field("auth", &self.auth)
            .field("log_format", &self.log_format)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("store_timeout", &self.store_timeout)
            .field("max_connections", &self.max_connections)
            .field("lease_duration", &self.lease_duration)
            .field("settle_within", &self.settle_within)
            .field("catalog_stale_after", &self.catalog_stale_after)
            .field("work_retention", &self.work_retention)
            .field("history_retention", &self.history_retention)
            .field("audit_retention", &self.audit_retention)
            .field("quotas", &self.quotas)
            .field("admit_client_ip_header", &self.admit_client_ip_header)
            .field("flows", &self.flows)
            .field("route_classes", &self.route_classes)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration error: {}", describe(.0))]
    Figment(Box<figment::Error>),
    #[error("configuration error: `{key}` {why}")]
    Invalid { key: String, why: String },
}

impl From<figment::Error> for ConfigError {
    fn from(error: figment::Error) -> Self {
        Self::Figment(Box::new(error))
    }
}

/// Each problem with the key it concerns and where the value came from: the
/// file's path, or the exact environment variable.
fn describe(errors: &figment::Error) -> String {
    errors
        .clone()
        .into_iter()
        .map(|error| {
            let key = error.path.join(".").to_lowercase();
            let source = match &error.metadata {
                Some(meta) if meta.name.contains("environment variable") => {
                    let prefix = meta.name.split('`').nth(1).unwrap_or("");
                    format!("environment variable {prefix}{}", key.to_uppercase())
                }
                Some(meta) => match &meta.source {
                    Some(source) => format!("{} {source}", meta.name),
                    None => meta.name.to_string(),
                },
                None => "defaults".to_string(),
            };
            // A file that cannot be read concerns no key.
            if key.is_empty() {
                format!("{} (from {source})", error.kind)
            } else {
                format!("`{key}`: {} (from {source})", error.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Durations are written the human way ("15m", "1500ms") in files and env.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!("`{text}` is not a duration like 15m or 90s: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ignored(names: &[&str]) -> Vec<String> {
        ignored_env_vars(names.iter().map(|n| n.to_string()))
    }

    #[test]
    fn a_typo_in_a_variable_is_named_with_what_was_meant() {
        let warnings = ignored(&["QUOTA_HOURLY_CEILNG", "QUOTA_LISTEN", "PATH"]);
        assert_eq!(
            warnings,
            ["QUOTA_HOURLY_CEILNG is not a setting and is ignored (did you mean QUOTA_HOURLY_CEILING?)"]
        );
        assert_eq!(
            ignored(&["QUOTA_SOMETHING_ELSE_ENTIRELY"]),
            ["QUOTA_SOMETHING_ELSE_ENTIRELY is not a setting and is ignored"]
        );
    }

    #[test]
    fn platform_service_links_and_the_client_are_not_named() {
        let injected = [
            "QUOTA_SERVICE_HOST",
            "QUOTA_SERVICE_PORT",
            "QUOTA_SERVICE_PORT_HTTP",
            "QUOTA_PORT",
            "QUOTA_PORT_8080_TCP",
            "QUOTA_PORT_8080_TCP_PROTO",
            "QUOTA_PORT_8080_TCP_PORT",
            "QUOTA_PORT_8080_TCP_ADDR",
            "QUOTA_ARBITER_SERVICE_HOST",
            "QUOTA_ARBITER_PORT_8080_TCP_ADDR",
            "QUOTA_ARBITER_URL",
            "QUOTA_CONFIG",
        ];
        assert_eq!(ignored(&injected), Vec::<String>::new());
        assert_eq!(
            ignored(&["QUOTA_PORT_HTTP_TCP"]).len(),
            1,
            "not a link's shape"
        );
        // A link's variable ends in its protocol, or in one of _PROTO, _PORT
        // and _ADDR after it: anything else is somebody's typo.
        let not_links = ["QUOTA_PORT_8080_TCP_HOST", "QUOTA_PORT_8080_TCP_PORT_ADDR"];
        assert_eq!(ignored(&not_links).len(), 2, "{:?}", ignored(&not_links));
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        for (a, b, distance) in [
            ("", "", 0),
            ("abc", "", 3),
            ("", "abc", 3),
            ("abc", "a", 2),
            ("ab", "ba", 2),
            ("flaw", "lawn", 2),
            ("kitten", "sitting", 3),
            ("QUOTA_HOURLY_CEILNG", "QUOTA_HOURLY_CEILING", 1),
        ] {
            assert_eq!(edit_distance(a, b), distance, "{a:?} to {b:?}");
        }
    }
}
