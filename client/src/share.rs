//! What the arbiter's share broadcast (`GET /v1/stream`, design.md §10) tells
//! a client, and the rule that turns it into this client's share of a quota.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;

use crate::adapt::{Limits, BURST_FLOOR, RATE_FLOOR};

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
    pub rate: Option<f64>,
    pub burst: Option<f64>,
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

/// One window of a quota in a `share` event: its ceiling and its length.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ShareWindow {
    pub period: String,
    pub ceiling: i64,
    /// The window's nominal length (a month: 30 days).
    pub seconds: u64,
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
    /// This client's part of the quota's rate and burst: the most its local
    /// fallback decides, before adapting to the upstream.
    pub limits: Limits,
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
    /// The rule (design.md §12): the quota's effective cadence, or without
    /// cadence the rate that spreads each window's ceiling evenly over it
    /// (`ceiling / seconds`, the least of them, a burst of 1); with both, the
    /// cadence never above that rate, so that no window is spent faster than
    /// its ceiling allows. Divided among its live clients, never below
    /// 0.01/s and a burst of 1. `None` when the event says too little.
    pub fn client_limits(&self) -> Option<Limits> {
        let spread = |ceiling: i64, seconds: u64| ceiling as f64 / seconds.max(1) as f64;
        let windows = self.windows.iter().map(|w| spread(w.ceiling, w.seconds));
        let budget = match self.windows.is_empty() {
            false => windows.reduce(f64::min),
            true => self.hourly_ceiling.map(|ceiling| spread(ceiling, 3600)),
        };
        let (rate, burst) = match (self.rate, self.burst) {
            (Some(rate), Some(burst)) => (budget.map_or(rate, |b| rate.min(b)), burst),
            _ => (budget?, 1.0),
        };
        let clients = self.clients.max(1) as f64;
        let limits = Limits {
            rate: (rate / clients).max(RATE_FLOOR),
            burst: (burst / clients).max(BURST_FLOOR),
        };
        (limits.rate.is_finite() && limits.burst.is_finite()).then_some(limits)
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
        for quota in &event.quotas {
            let Some(limits) = quota.client_limits() else {
                continue;
            };
            for flow in &quota.flows {
                let share = Share {
                    quota: quota.quota.clone(),
                    limits,
                    clients: u32::try_from(quota.clients.max(1)).unwrap_or(u32::MAX),
                    fallback: flow.fallback == "local",
                    bypass_horizon,
                };
                // A flow that spends several quotas spends every one of
                // them in each call: its share is the tightest of them.
                let tighter = |kept: &Share| kept.limits.rate <= share.limits.rate;
                if seen.insert(flow.flow.clone()) || !by_flow.get(&flow.flow).is_some_and(tighter) {
                    by_flow.insert(flow.flow.clone(), share);
                }
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
    fn a_share_never_drops_below_the_floors() {
        let crowded = quota(
            r#"{"quota": "api", "rate": 1.0, "burst": 5.0, "hourly_ceiling": 10,
            "clients": 1000, "flows": []}"#,
        );
        assert_eq!(
            crowded.client_limits(),
            Some(limits(RATE_FLOOR, BURST_FLOOR))
        );
    }
}
