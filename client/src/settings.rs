//! The client's settings from the environment. A broken value never stops a
//! worker: it falls back to its default with one warning naming the variable.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use reqwest::Url;

use crate::gate::MIN_RATE;
use crate::retry::RetryPolicy;

pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// More attempts than this is a typo, not a policy.
const MAX_ATTEMPTS: u32 = 100;

/// Local pacing: at most `rate` requests per second to the arbiter, `burst`
/// at once; shared by every client of the process with the same pacing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacing {
    pub rate: f64,
    pub burst: u32,
}

#[derive(Clone, PartialEq)]
pub struct Settings {
    pub url: Url,
    /// Sent as `Authorization: Bearer`; never printed.
    pub key: Option<String>,
    /// `None`: no local pacing (the default, `QUOTA_CLIENT_RATE=0`).
    pub pacing: Option<Pacing>,
    pub retry: RetryPolicy,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            url: Url::parse(DEFAULT_URL).expect("the default URL parses"),
            key: None,
            pacing: None,
            retry: RetryPolicy::default(),
        }
    }
}

/// The key is a secret: `{:?}` says whether there is one, never what it is.
impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("url", &self.url.as_str())
            .field("key", &self.key.as_ref().map(|_| "<set>"))
            .field("pacing", &self.pacing)
            .field("retry", &self.retry)
            .finish()
    }
}

impl Settings {
    /// Reads the `QUOTA_*` client variables from `vars`; returns the settings
    /// and one warning per broken variable (its default was used instead).
    pub fn from_vars(vars: &HashMap<String, String>) -> (Self, Vec<String>) {
        let mut env = Reader {
            vars,
            warnings: Vec::new(),
        };
        let defaults = Settings::default();
        let rate = env.read("QUOTA_CLIENT_RATE", parse_rate).unwrap_or(0.0);
        let burst = env.read("QUOTA_CLIENT_BURST", parse_burst).unwrap_or(0);
        let settings = Settings {
            url: env
                .read("QUOTA_ARBITER_URL", parse_url)
                .unwrap_or(defaults.url),
            key: env.read("QUOTA_ARBITER_KEY", parse_key),
            // A rate without a burst still paces: one request at a time.
            pacing: (rate > 0.0).then_some(Pacing {
                rate,
                burst: burst.max(1),
            }),
            retry: RetryPolicy {
                attempts: env
                    .read("QUOTA_RETRY_ATTEMPTS", parse_attempts)
                    .unwrap_or(defaults.retry.attempts),
                base: env
                    .read("QUOTA_RETRY_BASE", parse_wait)
                    .unwrap_or(defaults.retry.base),
                max: env
                    .read("QUOTA_RETRY_MAX", parse_wait)
                    .unwrap_or(defaults.retry.max),
            },
        };
        (settings, env.warnings)
    }

    /// [`Settings::from_vars`] over the process environment, each warning
    /// logged once.
    pub fn from_env() -> Self {
        let (settings, warnings) = Self::from_vars(&std::env::vars().collect());
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        settings
    }
}

/// Reads variables, keeping one warning per broken one.
struct Reader<'a> {
    vars: &'a HashMap<String, String>,
    warnings: Vec<String>,
}

impl Reader<'_> {
    fn read<T>(&mut self, name: &str, parse: fn(&str) -> Result<T, String>) -> Option<T> {
        let value = self.vars.get(name)?;
        parse(value)
            .map_err(|why| {
                self.warnings
                    .push(format!("{name}: {why}; using its default"))
            })
            .ok()
    }
}

pub(crate) fn parse_url(value: &str) -> Result<Url, String> {
    let url = Url::parse(value.trim()).map_err(|why| format!("`{value}` is not a URL ({why})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("`{value}` is not an http(s) URL with a host"));
    }
    Ok(url)
}

/// The key is a secret: the warning says what is wrong, never the value.
fn parse_key(value: &str) -> Result<String, String> {
    let key = value.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("not a bearer token (empty, or not visible ASCII)".into());
    }
    Ok(key.to_string())
}

fn parse_rate(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(rate) if rate == 0.0 || (rate.is_finite() && rate >= MIN_RATE) => Ok(rate),
        _ => Err(format!(
            "`{value}` is not a rate (requests per second: 0 to disable, else at least {MIN_RATE})"
        )),
    }
}

fn parse_burst(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("`{value}` is not a burst (a whole number, 0 or more)"))
}

fn parse_attempts(value: &str) -> Result<u32, String> {
    match value.trim().parse() {
        Ok(n) if (1..=MAX_ATTEMPTS).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{value}` is not a number of attempts (1-{MAX_ATTEMPTS})"
        )),
    }
}

/// A wait like `2s`, `500ms` or `2m`; zero would make retries a stampede.
fn parse_wait(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value.trim()) {
        Ok(wait) if !wait.is_zero() => Ok(wait),
        _ => Err(format!(
            "`{value}` is not a duration above zero, like 2s or 2m"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nothing_set_is_the_defaults() {
        let (settings, warnings) = Settings::from_vars(&HashMap::new());
        assert_eq!(settings, Settings::default());
        assert_eq!(settings.url.as_str(), "http://127.0.0.1:8080/");
        assert_eq!(
            settings.retry,
            RetryPolicy {
                attempts: 7,
                base: Duration::from_secs(2),
                max: Duration::from_secs(120)
            }
        );
        assert!(warnings.is_empty());
    }

    #[test]
    fn every_variable_is_read() {
        let (settings, warnings) = Settings::from_vars(&vars(&[
            ("QUOTA_ARBITER_URL", "https://arbiter.internal:8443/"),
            ("QUOTA_ARBITER_KEY", "s3cret"),
            ("QUOTA_CLIENT_RATE", "12.5"),
            ("QUOTA_CLIENT_BURST", "4"),
            ("QUOTA_RETRY_ATTEMPTS", "3"),
            ("QUOTA_RETRY_BASE", "500ms"),
            ("QUOTA_RETRY_MAX", "2m"),
        ]));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(settings.url.as_str(), "https://arbiter.internal:8443/");
        assert_eq!(settings.key.as_deref(), Some("s3cret"));
        assert_eq!(
            settings.pacing,
            Some(Pacing {
                rate: 12.5,
                burst: 4
            })
        );
        assert_eq!(
            settings.retry,
            RetryPolicy {
                attempts: 3,
                base: Duration::from_millis(500),
                max: Duration::from_secs(120)
            }
        );
    }

    #[test]
    fn a_rate_of_zero_disables_pacing_and_a_rate_alone_paces_one_at_a_time() {
        let (off, _) = Settings::from_vars(&vars(&[
            ("QUOTA_CLIENT_RATE", "0"),
            ("QUOTA_CLIENT_BURST", "9"),
        ]));
        assert_eq!(off.pacing, None);
        let (on, _) = Settings::from_vars(&vars(&[("QUOTA_CLIENT_RATE", "5")]));
        assert_eq!(
            on.pacing,
            Some(Pacing {
                rate: 5.0,
                burst: 1
            })
        );
    }

    #[test]
    fn broken_values_fall_back_to_defaults_with_one_warning_each() {
        let (settings, warnings) = Settings::from_vars(&vars(&[
            ("QUOTA_ARBITER_URL", "arbiter:8080"),
            ("QUOTA_ARBITER_KEY", "two words"),
            ("QUOTA_CLIENT_RATE", "1e-9"),
            ("QUOTA_CLIENT_BURST", "lots"),
            ("QUOTA_RETRY_ATTEMPTS", "0"),
            ("QUOTA_RETRY_BASE", "2"),
            ("QUOTA_RETRY_MAX", "0s"),
        ]));
        assert_eq!(settings, Settings::default());
        let mut named: Vec<&str> = warnings
            .iter()
            .map(|w| w.split(':').next().unwrap())
            .collect();
        named.sort_unstable();
        assert_eq!(
            named,
            [
                "QUOTA_ARBITER_KEY",
                "QUOTA_ARBITER_URL",
                "QUOTA_CLIENT_BURST",
                "QUOTA_CLIENT_RATE",
                "QUOTA_RETRY_ATTEMPTS",
                "QUOTA_RETRY_BASE",
                "QUOTA_RETRY_MAX"
            ]
        );
        assert!(warnings.iter().all(|w| w.ends_with("using its default")));
        assert!(
            !warnings.iter().any(|w| w.contains("two words")),
            "the key leaked"
        );
    }

    #[test]
    fn one_broken_value_leaves_the_others_read() {
        let (settings, warnings) = Settings::from_vars(&vars(&[
            ("QUOTA_RETRY_BASE", "soon"),
            ("QUOTA_RETRY_ATTEMPTS", "4"),
        ]));
        assert_eq!(settings.retry.attempts, 4);
        for broken_rate in ["-1", "NaN", "inf", "fast"] {
            let (settings, warnings) =
                Settings::from_vars(&vars(&[("QUOTA_CLIENT_RATE", broken_rate)]));
            assert_eq!(
                (settings.pacing, warnings.len()),
                (None, 1),
                "{broken_rate}"
            );
        }
        assert_eq!(settings.retry.base, Duration::from_secs(2));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("QUOTA_RETRY_BASE") && warnings[0].contains("soon"));
    }
}
