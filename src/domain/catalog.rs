//! The catalog's rules: quotas, flows and route classes as a decision reads
//! them (a [`Snapshot`]), and the settings an operator writes. The replica's
//! copy of it, reloaded from the database, is `crate::catalog::Catalog`.

use std::collections::HashMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::domain::admission::RouteClass;
use crate::domain::window::WindowRule;

mod settings;

pub use settings::{
    Fallback, FlowBody, FlowPatch, FlowPatchError, FlowSettings, QuotaLimits, QuotaPatch,
    QuotaSettings, DEFAULT_PRIORITY, MAX_FLOW_QUOTAS,
};

pub use crate::domain::input::{name as validate_name, MAX_NAME_LEN};
pub use crate::domain::{Patch, MAX_BURST, MAX_CEILING, MAX_RATE, MIN_RATE};
/// Checks a ceiling; the same bounds as the table's CHECK.
pub(crate) fn validate_ceiling(field: &str, ceiling: i64) -> Result<(), String> {
    if !(0..=MAX_CEILING).contains(&ceiling) {
        return Err(format!("`{field}` must be between 0 and {MAX_CEILING}"));
    }
    Ok(())
}

/// Checks a cadence; the same bounds as the table's CHECKs.
pub(crate) fn validate_cadence(rate: Option<f64>, burst: Option<f64>) -> Result<(), String> {
    match (rate, burst) {
        (Some(rate), Some(burst))
            if (MIN_RATE..=MAX_RATE).contains(&rate) && (1.0..=MAX_BURST).contains(&burst) =>
        {
            Ok(())
        }
        (None, None) => Ok(()),
        _ => Err(format!(
            "`rate` ({MIN_RATE} <= rate <= {MAX_RATE}) and `burst` (1 <= burst <= {MAX_BURST}) go together"
        )),
    }
}

/// What a flow's decisions do with the quota (design.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Attempt and count the slot, always grant; flag what enforcement would defer.
    Observe,
    /// A full window defers.
    Enforce,
    /// Never throttled; counted after the fact.
    Count,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Observe => "observe",
            Mode::Enforce => "enforce",
            Mode::Count => "count",
        }
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "observe" => Ok(Mode::Observe),
            "enforce" => Ok(Mode::Enforce),
            "count" => Ok(Mode::Count),
            other => Err(format!(
                "unknown mode `{other}` (observe, enforce or count)"
            )),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct QuotaRule {
    pub name: String,
    /// Its windows, shortest first (design.md §12); none: no budget.
    pub windows: Vec<WindowRule>,
    pub cadence: Option<Cadence>,
    pub max_in_flight: Option<i32>,
    /// Headroom: share (percent) of the ceiling open to priority 2 and 3 flows.
    pub priority2_share: Option<i16>,
    pub priority3_share: Option<i16>,
}

/// A short-window governor beside the hourly budget: a token bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cadence {
    /// Sustained tokens per second.
    pub rate: f64,
    /// Bucket size: how many can go at once after a quiet spell.
    pub burst: f64,
    /// Shrink on upstream errors, recover passively.
    pub adaptive: bool,
}

impl QuotaRule {
    /// Only the window's count decides (headroom included): concurrent
    /// decisions can share one take-up-to-k statement.
    pub(crate) fn decided_by_window_alone(&self) -> bool {
        self.cadence.is_none() && self.max_in_flight.is_none()
    }

    /// The share (percent) of each window's ceiling a flow of `priority`
    /// may use: lower priorities stop short of the top of every window when
    /// the quota reserves headroom. `None`: all of it.
    pub(crate) fn share_for(&self, priority: i16) -> Option<i16> {
        match priority {
            ..=1 => None,
            2 => self.priority2_share,
            _ => self.priority3_share.or(self.priority2_share),
        }
    }

    /// The count a flow of `priority` may reach in each window, in the
    /// order of [`QuotaRule::windows`].
    pub(crate) fn ceilings_for(&self, priority: i16) -> Vec<i64> {
        let share = self.share_for(priority);
        self.windows.iter().map(|w| w.ceiling_for(share)).collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct FlowRule {
    pub name: String,
    /// The quota its answers name.
    pub quota: String,
    /// The quotas it spends besides, in order (design.md §12): a call
    /// spends every one of them and `quota`, or none.
    pub further_quotas: Vec<String>,
    pub mode: Mode,
    pub priority: i16,
    /// Enforce mode: the share (1-100) of over-ceiling decisions actually deferred.
    pub enforce_percent: i16,
}

/// A flow together with the quotas it spends, as a decision needs them.
#[derive(Clone, Debug)]
pub struct Rule {
    pub flow: FlowRule,
    /// The quota its answers name.
    pub quota: QuotaRule,
    /// The flow's further quotas, in order (empty: it spends one quota).
    pub further: Vec<QuotaRule>,
}

impl Rule {
    /// Every quota the flow spends: its own, then the further ones.
    pub fn quotas(&self) -> impl Iterator<Item = &QuotaRule> {
        std::iter::once(&self.quota).chain(&self.further)
    }

    /// Whether a call spends several quotas: then one statement decides
    /// them together (design.md §12).
    pub(crate) fn spends_several(&self) -> bool {
        !self.further.is_empty()
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    quotas: HashMap<String, QuotaRule>,
    flows: HashMap<String, FlowRule>,
    route_classes: HashMap<String, RouteClass>,
}

impl Snapshot {
    /// A snapshot of these quotas and flows (no route class), as unit tests
    /// of the decision paths build one.
    #[cfg(test)]
    pub(crate) fn of(quotas: Vec<QuotaRule>, flows: Vec<FlowRule>) -> Self {
        Snapshot::new(quotas, flows, Vec::new())
    }

    /// The catalog as these rules (each keyed by its name).
    pub fn new(
        quotas: Vec<QuotaRule>,
        flows: Vec<FlowRule>,
        route_classes: Vec<RouteClass>,
    ) -> Self {
        Snapshot {
            quotas: quotas.into_iter().map(|q| (q.name.clone(), q)).collect(),
            flows: flows.into_iter().map(|f| (f.name.clone(), f)).collect(),
            route_classes: route_classes
                .into_iter()
                .map(|r| (r.name.clone(), r))
                .collect(),
        }
    }

    pub fn rule(&self, flow: &str) -> Option<Rule> {
        let flow = self.flows.get(flow)?;
        let quota = self.quotas.get(&flow.quota)?;
        let further = flow
            .further_quotas
            .iter()
            .map(|name| self.quotas.get(name).cloned())
            .collect::<Option<Vec<_>>>()?;
        Some(Rule {
            flow: flow.clone(),
            quota: quota.clone(),
            further,
        })
    }

    pub(crate) fn has_quota(&self, quota: &str) -> bool {
        self.quotas.contains_key(quota)
    }

    pub fn flows(&self) -> impl Iterator<Item = &FlowRule> {
        self.flows.values()
    }

    /// The admission profile a gateway names (design.md §11).
    pub fn route_class(&self, name: &str) -> Option<&RouteClass> {
        self.route_classes.get(name)
    }

    pub fn route_classes(&self) -> impl Iterator<Item = &RouteClass> {
        self.route_classes.values()
    }
}

/// A flow the config file declares: seeded when the table lacks it
/// (`crate::store::seed_catalog`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSeed {
    /// The quota it spends; or `quotas`, every one in each call.
    #[serde(default)]
    pub quota: Option<String>,
    #[serde(default)]
    pub quotas: Option<Vec<String>>,
    pub mode: Option<Mode>,
    pub priority: Option<i16>,
    /// Seeds a new flow only, like `mode`; omitted: `off`.
    pub fallback: Option<Fallback>,
}

impl FlowSeed {
    /// The quotas it spends, checked as the API checks a flow's: its own
    /// first.
    pub fn quotas(&self) -> Result<Vec<crate::domain::QuotaName>, String> {
        settings::quotas_named(self.quota.clone(), self.quotas.clone())
    }
}

/// How a decision about a flow is handled, by the replica's catalog: the one
/// rule every decision path (a reservation, a batch's items, a claim's
/// flows) dispatches on. Work due within the bypass horizon is let through
/// before any of this (`crate::bypass::BypassDesk`).
pub(crate) enum Handling {
    /// Before the first catalog load nobody can tell an enforced flow from an
    /// unknown one: fail closed rather than wave everything through.
    CatalogNotLoaded,
    /// A flow the catalog does not know is never throttled.
    Unknown,
    /// `count`: spent after the fact, never throttled.
    Count(Rule),
    /// `observe`: spent and granted, told whether enforcing would defer.
    Observe(Rule),
    /// `enforce`: rationed; what does not fit is deferred.
    Enforce(Rule),
}

impl Handling {
    /// The flow's rule, when the catalog has one.
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            Handling::Count(rule) | Handling::Observe(rule) | Handling::Enforce(rule) => Some(rule),
            Handling::CatalogNotLoaded | Handling::Unknown => None,
        }
    }

    pub fn of(snapshot: Option<&Snapshot>, flow: &str) -> Handling {
        let Some(snapshot) = snapshot else {
            return Handling::CatalogNotLoaded;
        };
        match snapshot.rule(flow) {
            None => Handling::Unknown,
            Some(rule) => match rule.flow.mode {
                Mode::Count => Handling::Count(rule),
                Mode::Observe => Handling::Observe(rule),
                Mode::Enforce => Handling::Enforce(rule),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::window::Period;

    fn quota(priority2_share: Option<i16>, priority3_share: Option<i16>) -> QuotaRule {
        QuotaRule {
            name: "ppf".into(),
            windows: vec![
                WindowRule::hour(1000),
                WindowRule {
                    period: Period::parse("1d").unwrap(),
                    ceiling: 5000,
                    zone: None,
                },
            ],
            cadence: None,
            max_in_flight: None,
            priority2_share,
            priority3_share,
        }
    }

    #[test]
    fn each_priority_stops_at_its_own_share_of_the_ceiling() {
        let shared = quota(Some(90), Some(80));
        let ceilings: Vec<Vec<i64>> = (0..=4).map(|p| shared.ceilings_for(p)).collect();
        assert_eq!(
            ceilings,
            [
                [1000, 5000],
                [1000, 5000],
                [900, 4500],
                [800, 4000],
                [800, 4000]
            ]
        );
        // Priority 3 without a share of its own stops where priority 2 does.
        assert_eq!(quota(Some(90), None).ceilings_for(3), [900, 4500]);
        assert_eq!(quota(None, None).ceilings_for(3), [1000, 5000]);
    }

    #[test]
    fn a_decision_routes_by_the_catalog_and_the_flows_mode() {
        let quota = QuotaRule {
            name: "ppf".into(),
            windows: vec![WindowRule::hour(10)],
            cadence: None,
            max_in_flight: None,
            priority2_share: None,
            priority3_share: None,
        };
        let flow = |name: &str, mode| FlowRule {
            name: name.into(),
            quota: "ppf".into(),
            further_quotas: Vec::new(),
            mode,
            priority: 2,
            enforce_percent: 100,
        };
        let flows = vec![
            flow("counted", Mode::Count),
            flow("observed", Mode::Observe),
            flow("enforced", Mode::Enforce),
            // A flow whose quota the snapshot lacks is no rule: unknown.
            FlowRule {
                quota: "gone".into(),
                ..flow("orphan", Mode::Enforce)
            },
        ];
        let snapshot = Snapshot::of(vec![quota], flows);
        let route = |name| match Handling::of(Some(&snapshot), name) {
            Handling::CatalogNotLoaded => "fail closed".to_string(),
            Handling::Unknown => "unknown".to_string(),
            Handling::Count(rule) => format!("count {}", rule.flow.name),
            Handling::Observe(rule) => format!("observe {}", rule.flow.name),
            Handling::Enforce(rule) => format!("enforce {} on {}", rule.flow.name, rule.quota.name),
        };
        assert_eq!(route("counted"), "count counted");
        assert_eq!(route("observed"), "observe observed");
        assert_eq!(route("enforced"), "enforce enforced on ppf");
        assert_eq!(route("orphan"), "unknown");
        assert_eq!(route("nobody"), "unknown");
        for flow in ["enforced", "nobody"] {
            assert!(
                matches!(Handling::of(None, flow), Handling::CatalogNotLoaded),
                "{flow}: before the first catalog load every flow fails closed"
            );
        }
    }
}
