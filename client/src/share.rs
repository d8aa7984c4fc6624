//! What the arbiter's share broadcast (`GET /v1/stream`, design.md §10) tells
//! a client, and the rule that turns it into this client's share of a quota.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::adapt::Limits;

/// The `share` event's data.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ShareEvent {
    pub quotas: Vec<QuotaShare>,
    /// The arbiter's bypass horizon; absent from an older arbiter (then
    /// nothing is let through at once: due work waits like the rest).
    #[serde(default)]
    pub bypass_horizon_seconds: Option<f64>,
}

/// One quota of a `share` event.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct QuotaShare {
    pub quota: String,
    /// The cadence in force (after the arbiter's adaptive slow-down).
    pub rate: Option<f64>,
    pub burst: Option<f64>,
    /// The cadence as configured: what a local rate recovers toward.
    /// Absent from an older arbiter (then the cadence in force is all).
    #[serde(default)]
    pub configured_rate: Option<f64>,
    #[serde(default)]
    pub configured_burst: Option<f64>,
    /// Absent from an older arbiter: without cadence there is then no safe
    /// rate to derive, and no share.
    pub hourly_ceiling: Option<i64>,
    /// Every window of the quota (design.md §12); absent from an older
    /// arbiter, whose only window was the hour.
    #[serde(default)]
    pub windows: Vec<ShareWindow>,
    pub clients: i64,
    #[serde(default)]
    pub flows: Vec<FlowShare>,
}

/// One window of a quota in a `share` event: its ceiling and its length,
/// and what the current one had left when the event was made.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ShareWindow {
    pub period: String,
    pub ceiling: i64,
    /// The window's nominal length (a month: 30 days).
    pub seconds: u64,
    /// Absent from an older arbiter: then the whole ceiling is taken as left.
    #[serde(default)]
    pub left: Option<i64>,
    /// Seconds from the event to the current window's end; absent from an
    /// older arbiter (then the window is taken to start with the event).
    #[serde(default)]
    pub ends_in_seconds: Option<f64>,
}

/// This client's part of one window of a quota, from a `share` event: what
/// it may spend locally until the window ends, then in each window after.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowShare {
    pub quota: String,
    pub period: String,
    /// What the window had left, divided among the quota's live clients.
    pub left: f64,
    /// The window's ceiling divided among them: each next window's part.
    pub per_window: f64,
    /// When the current window ends, by this client's clock.
    pub ends_at: Instant,
    pub length: Duration,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct FlowShare {
    pub flow: String,
    /// `off`, `local`, or a value this client does not know (treated as off).
    pub fallback: String,
}

/// This client's share of a quota, as its last `share` event told it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Share {
    pub quota: String,
    /// This client's part of the quota's rate and burst as configured: the
    /// most its local fallback decides, before adapting to the upstream.
    pub limits: Limits,
    /// Where the arbiter's adaptive slow-down stood (the cadence in force
    /// over the configured one): the local rate starts there and recovers
    /// toward `limits`.
    pub factor: f64,
    /// This client's part of every window of the flow's quotas: its local
    /// decisions never spend more (design.md §13).
    pub windows: Vec<WindowShare>,
    /// When the event this share comes from arrived.
    pub received_at: Instant,
    /// Live clients of the quota across the arbiter's replicas, this one included.
    pub clients: u32,
    /// Whether the flow asked (`"fallback": "local"`) to be decided locally
    /// while the arbiter is unreachable.
    pub fallback: bool,
    /// Work due within this is let through at once by the local fallback,
    /// as the arbiter would bypass it; `None` when the arbiter did not say.
    pub bypass_horizon: Option<Duration>,
}

impl QuotaShare {
    /// The rule (design.md §12, §13): the quota's configured cadence, or
    /// without cadence the rate that spreads each window's ceiling evenly
    /// over it (`ceiling / seconds`, the least of them, a burst of 1); with
    /// both, the cadence never above that rate, so that no window is spent
    /// faster than its ceiling allows. The rate (and a cadence's burst)
    /// divided among its live clients, with no floor: many clients on a
    /// small quota each get a small part. `None` when the event says too
    /// little.
    pub fn client_limits(&self) -> Option<Limits> {
        let spread = |ceiling: i64, seconds: u64| ceiling as f64 / seconds.max(1) as f64;
        let windows = self.windows.iter().map(|w| spread(w.ceiling, w.seconds));
        let budget = match self.windows.is_empty() {
            false => windows.reduce(f64::min),
            true => self.hourly_ceiling.map(|ceiling| spread(ceiling, 3600)),
        };
        let configured = (
            self.configured_rate.or(self.rate),
            self.configured_burst.or(self.burst),
        );
        let clients = self.clients.max(1) as f64;
        // Without cadence the burst is one call's: a pace, not an amount
        // (what each window has left bounds the amount, `client_windows`).
        let (rate, burst) = match configured {
            (Some(rate), Some(burst)) => (budget.map_or(rate, |b| rate.min(b)), burst / clients),
            _ => (budget?, 1.0),
        };
        let limits = Limits {
            rate: rate / clients,
            burst,
        };
        (limits.rate.is_finite() && limits.burst.is_finite()).then_some(limits)
    }

    /// Where the arbiter's adaptive slow-down stands: the cadence in force
    /// over the configured one (1 without cadence or a configured one).
    pub fn factor(&self) -> f64 {
        match (self.rate, self.configured_rate) {
            (Some(rate), Some(configured)) if configured > 0.0 => {
                (rate / configured).clamp(0.0, 1.0)
            }
            _ => 1.0,
        }
    }

    /// This client's part of each window, the event received `at`.
    pub fn client_windows(&self, at: Instant) -> Vec<WindowShare> {
        let clients = self.clients.max(1) as f64;
        self.windows
            .iter()
            .map(|window| {
                let length = Duration::from_secs(window.seconds.max(1));
                let ends_in = window
                    .ends_in_seconds
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .unwrap_or(length);
                WindowShare {
                    quota: self.quota.clone(),
                    period: window.period.clone(),
                    left: window.left.unwrap_or(window.ceiling).max(0) as f64 / clients,
                    per_window: window.ceiling.max(0) as f64 / clients,
                    ends_at: at + ends_in,
                    length,
                }
            })
            .collect()
    }
}

/// The last `share` event, as the client's stream received it.
#[derive(Default)]
pub struct Shares {
    by_flow: Mutex<HashMap<String, Share>>,
}

impl Shares {
    /// The newest event replaces what the previous ones said; a flow it no
    /// longer names keeps its last share (a stream that reconnected with
    /// fewer flows, or a quota the arbiter could not read this time).
    pub fn update(&self, event: &ShareEvent) {
        let bypass_horizon = event
            .bypass_horizon_seconds
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok());
        let mut by_flow = crate::gate::lock(&self.by_flow);
        let mut seen = std::collections::HashSet::new();
        let received_at = Instant::now();
        for quota in &event.quotas {
            let Some(limits) = quota.client_limits() else {
                continue;
            };
            let windows = quota.client_windows(received_at);
            for flow in &quota.flows {
                let mut share = Share {
                    quota: quota.quota.clone(),
                    limits,
                    factor: quota.factor(),
                    windows: windows.clone(),
                    received_at,
                    clients: u32::try_from(quota.clients.max(1)).unwrap_or(u32::MAX),
                    fallback: flow.fallback == "local",
                    bypass_horizon,
                };
                // A flow that spends several quotas spends every one of
                // them in each call: its pace is the tightest of them, and
                // it keeps within the windows of all of them.
                if !seen.insert(flow.flow.clone()) {
                    if let Some(kept) = by_flow.get(&flow.flow) {
                        let mut every = kept.windows.clone();
                        every.extend(windows.iter().cloned());
                        if kept.limits.rate * kept.factor <= share.limits.rate * share.factor {
                            share = kept.clone();
                        }
                        share.windows = every;
                    }
                }
                by_flow.insert(flow.flow.clone(), share);
            }
        }
    }

    pub fn of(&self, flow: &str) -> Option<Share> {
        crate::gate::lock(&self.by_flow).get(flow).cloned()
    }

    /// The share of a quota, by any flow of it this client follows.
    pub fn of_quota(&self, quota: &str) -> Option<Share> {
        crate::gate::lock(&self.by_flow)
            .values()
            .find(|share| share.quota == quota)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: f64, burst: f64) -> Limits {
        Limits { rate, burst }
    }

    fn quota(json: &str) -> QuotaShare {
        serde_json::from_str(json).unwrap()
    }

    fn event(json: &str) -> ShareEvent {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_flow_of_several_quotas_follows_the_tightest_share_in_any_order() {
        let requests = r#"{"quota": "llm-requests", "rate": 8.0, "burst": 4.0, "hourly_ceiling": 1000000,
            "clients": 1, "flows": [{"flow": "chat", "fallback": "local"}]}"#;
        let tokens = r#"{"quota": "llm-tokens", "rate": 2.0, "burst": 2.0, "hourly_ceiling": 1000000,
            "clients": 1, "flows": [{"flow": "chat", "fallback": "local"}]}"#;
        for (first, second) in [(requests, tokens), (tokens, requests)] {
            let shares = Shares::default();
            shares.update(&event(&format!(r#"{{"quotas": [{first}, {second}]}}"#)));
            let chat = shares.of("chat").unwrap();
            assert_eq!(
                (chat.quota.as_str(), chat.limits),
                ("llm-tokens", limits(2.0, 2.0))
            );
            // The next event replaces it, the tightest again.
            shares.update(&event(&format!(r#"{{"quotas": [{second}, {first}]}}"#)));
            assert_eq!(shares.of("chat").unwrap().limits, limits(2.0, 2.0));
        }
    }

    #[test]
    fn the_share_is_the_cadence_divided_among_the_clients() {
        let shares = Shares::default();
        shares.update(&event(
            r#"{"quotas": [{"quota": "api", "rate": 30.0, "burst": 6.0, "hourly_ceiling": 1000000,
            "clients": 3, "flows": [{"flow": "invoice", "fallback": "local"},
            {"flow": "sync", "fallback": "off"}]}]}"#,
        ));
        let invoice = shares.of("invoice").unwrap();
        assert_eq!(invoice.limits, limits(10.0, 2.0));
        assert_eq!((invoice.clients, invoice.fallback), (3, true));
        // An older arbiter says no horizon: due work is not let through.
        assert_eq!(invoice.bypass_horizon, None);
        assert!(!shares.of("sync").unwrap().fallback);
        assert_eq!(shares.of("nobody"), None);
        assert_eq!(shares.of_quota("api").unwrap().limits.rate, 10.0);
    }

    #[test]
    fn the_bypass_horizon_comes_with_every_share() {
        let shares = Shares::default();
        shares.update(&event(
            r#"{"quotas": [{"quota": "api", "rate": 3.0, "burst": 1.0, "hourly_ceiling": 100,
            "clients": 1, "flows": [{"flow": "invoice", "fallback": "local"}]}],
            "bypass_horizon_seconds": 900.5}"#,
        ));
        assert_eq!(
            shares.of("invoice").unwrap().bypass_horizon,
            Some(Duration::from_millis(900_500))
        );
    }

    #[test]
    fn without_cadence_the_ceiling_is_spread_over_the_hour_with_a_burst_of_one() {
        let quota = quota(
            r#"{"quota": "api", "rate": null, "burst": null, "hourly_ceiling": 7200,
            "clients": 4, "flows": []}"#,
        );
        assert_eq!(quota.client_limits(), Some(limits(0.5, 1.0)));
        // An older arbiter without the ceiling: no safe rate, no share.
        let older: QuotaShare =
            serde_json::from_str(r#"{"quota": "api", "rate": null, "burst": null, "clients": 1}"#)
                .unwrap();
        assert_eq!(older.client_limits(), None);
        // No live client counted yet (this one's heartbeat not in): all of it.
        let alone = QuotaShare {
            clients: 0,
            rate: Some(5.0),
            burst: Some(2.0),
            ..older
        };
        assert_eq!(alone.client_limits(), Some(limits(5.0, 2.0)));
    }

    #[test]
    fn every_window_bounds_the_rate_the_tightest_most() {
        // A minute of 600 (10/s) and a day of 8640 (0.1/s): the day's rate.
        let stacked = quota(
            r#"{"quota": "llm", "rate": null, "burst": null, "hourly_ceiling": null,
            "windows": [{"period": "1m", "ceiling": 600, "seconds": 60},
                        {"period": "1d", "ceiling": 8640, "seconds": 86400}],
            "clients": 1, "flows": []}"#,
        );
        assert_eq!(stacked.client_limits(), Some(limits(0.1, 1.0)));
        // A cadence faster than a window allows is held to the window.
        let paced = quota(
            r#"{"quota": "llm", "rate": 5.0, "burst": 3.0, "hourly_ceiling": 3600,
            "windows": [{"period": "1h", "ceiling": 3600, "seconds": 3600}],
            "clients": 2, "flows": []}"#,
        );
        assert_eq!(paced.client_limits(), Some(limits(0.5, 1.5)));
    }

    #[test]
    fn no_floor_lifts_a_share_above_the_fair_one() {
        // 1000 clients on 10 an hour: each gets a thousandth of the hour's
        // pace (the cadence of 1/s is faster than the hour allows).
        let crowded = quota(
            r#"{"quota": "api", "rate": 1.0, "burst": 5.0, "hourly_ceiling": 10,
            "clients": 1000, "flows": []}"#,
        );
        let limits = crowded.client_limits().unwrap();
        assert!(
            (limits.rate - 10.0 / 3600.0 / 1000.0).abs() < 1e-15,
            "{limits:?}"
        );
        assert!((limits.burst - 0.005).abs() < 1e-12, "{limits:?}");
    }

    #[test]
    fn a_share_starts_where_the_slow_down_stood_and_aims_at_the_configured_cadence() {
        let slowed = quota(
            r#"{"quota": "api", "rate": 2.0, "burst": 2.0, "configured_rate": 10.0,
            "configured_burst": 4.0, "hourly_ceiling": null, "clients": 2, "flows": []}"#,
        );
        assert_eq!(slowed.client_limits(), Some(limits(5.0, 2.0)));
        assert!((slowed.factor() - 0.2).abs() < 1e-12);
    }

    #[test]
    fn each_client_gets_its_part_of_what_each_window_had_left() {
        let late = quota(
            r#"{"quota": "api", "rate": null, "burst": null, "hourly_ceiling": 1000,
            "windows": [{"period": "1h", "ceiling": 1000, "seconds": 3600, "left": 100,
                         "ends_in_seconds": 600.0}],
            "clients": 4, "flows": []}"#,
        );
        let at = Instant::now();
        let windows = late.client_windows(at);
        assert_eq!(windows.len(), 1);
        assert_eq!((windows[0].left, windows[0].per_window), (25.0, 250.0));
        assert_eq!(windows[0].ends_at, at + Duration::from_secs(600));
        assert_eq!(windows[0].length, Duration::from_secs(3600));
    }
}
