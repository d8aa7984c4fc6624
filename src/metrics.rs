//! Prometheus metrics. Label values come from the catalog, never straight from
//! a caller, so a stream of made-up flow names cannot blow up cardinality.
//! Every labelled counter whose label values are known in advance is created
//! at zero (store operations at start-up, flows once the catalog is read), so
//! `rate()` and `increase()` see the first event instead of a series appearing
//! out of nowhere.

use std::borrow::Cow;
use std::fmt::Write;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::domain::catalog::{FlowRule, Mode};
use crate::domain::decision::{Decision, Outcome};

/// Flow label used for every flow the catalog does not know.
pub(crate) const UNKNOWN_FLOW: &str = "_unknown";

/// Route class label of an admission answered before the catalog is loaded
/// (a class the catalog does not know is a 404, not counted).
pub(crate) const UNKNOWN_ROUTE_CLASS: &str = "_unknown";

/// The Prometheus text format the exposition is written in.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every store operation a decision, batch or claim can fail on: the
/// `operation` label values of `quota_arbiter_store_errors_total`.
/// `request`: an admin, report or dashboard request whose store work did not
/// finish within the store timeout.
pub const STORE_OPERATIONS: &[&str] = &[
    "admit",
    "reserve",
    "take_slots",
    "claim_work",
    "work_backlog",
    "enqueue_work",
    "get_work",
    "finish_work",
    "release_lease",
    "hold_lease",
    "settle",
    "adapt_cadence",
    "share_stream",
    "read_catalog",
    "change_catalog",
    "read_history",
    "readiness",
];

/// The outcomes a known flow's decisions can have in each mode; a flow the
/// catalog does not know is `unthrottled`, or `bypassed` when due.
fn outcomes_in(mode: Option<Mode>) -> &'static [Outcome] {
    match mode {
        Some(Mode::Observe) => &[Outcome::Granted, Outcome::Bypassed],
        Some(Mode::Enforce) => &[Outcome::Granted, Outcome::Deferred, Outcome::Bypassed],
        Some(Mode::Count) | None => &[Outcome::Unthrottled, Outcome::Bypassed],
    }
}

/// Modes whose grants can carry `would_defer`: observe, and enforce below 100 %.
const MODES_THAT_WOULD_DEFER: [Mode; 2] = [Mode::Observe, Mode::Enforce];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    quota: String,
    flow: String,
    outcome: String,
    mode: String,
}

impl DecisionLabels {
    fn new(quota: &str, flow: &str, outcome: Outcome, mode: Option<Mode>) -> Self {
        Self {
            quota: quota.to_string(),
            flow: flow.to_string(),
            outcome: outcome.as_str().to_string(),
            mode: mode.map(Mode::as_str).unwrap_or_default().to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowModeLabels {
    flow: String,
    quota: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowLabels {
    flow: String,
    quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    quota: String,
}

/// An admission answer: the route class (from the catalog, never a caller's
/// text) and the outcome. Never a principal or a tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmitLabels {
    route_class: String,
    outcome: String,
}

/// A route class, by name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteClassLabels {
    route_class: String,
}

/// One window of a quota: its quota and its period (`1m`, `1h`, `1d`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WindowLabels {
    quota: String,
    period: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    state: String,
}

/// Current usage of one window of a quota, as read at scrape time.
pub struct WindowUsage {
    pub quota: String,
    pub period: String,
    pub count: i64,
    pub ceiling: i64,
    /// Cadence in force (after adaptive shrinking), when the quota has one.
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
}

/// The service's instruments. Cheap to clone (one shared allocation): every
/// request clones the application state, and with it this; cloning each
/// family on its own was a tenth of the service's CPU under load.
#[derive(Clone)]
pub struct Metrics(Arc<Instruments>);

impl std::ops::Deref for Metrics {
    type Target = Instruments;

    fn deref(&self) -> &Instruments {
        &self.0
    }
}

pub struct Instruments {
    registry: Arc<Registry>,
    /// Admission (design.md §11), named `quota_admit_*` as the gateway
    /// operators' alert rules know them: a registry of its own, prefixed
    /// `quota` rather than `quota_arbiter`.
    admission: Arc<Registry>,
    admits: Family<AdmitLabels, Counter>,
    capacity_error_budget: Family<RouteClassLabels, Gauge<f64, AtomicU64>>,
    admit_seconds: Histogram,
    decisions: Family<DecisionLabels, Counter>,
    would_defer: Family<DecisionLabels, Counter>,
    reserve_seconds: Histogram,
    claim_wait_seconds: Histogram,
    store_errors: Family<OperationLabels, Counter>,
    background_restarts: Family<TaskLabels, Counter>,
    background_failures: Family<TaskLabels, Counter>,
    flow_mode: Family<FlowModeLabels, Gauge>,
    flow_enforce_percent: Family<FlowLabels, Gauge>,
    window_slots_spent: Family<WindowLabels, Gauge>,
    window_ceiling: Family<WindowLabels, Gauge>,
    pool_connections: Family<PoolLabels, Gauge>,
    pool_max_connections: Gauge,
    effective_rate: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
    effective_burst: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
    catalog_age_seconds: Gauge<f64, AtomicU64>,
    catalog_stale_after_seconds: Gauge<f64, AtomicU64>,
    store_synchronous: Gauge,
    store_timeline: Gauge,
    store_new_primaries: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The replica's PostgreSQL pool, as a scrape finds it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolReading {
    /// Connections open, idle or in use.
    pub open: u32,
    pub idle: usize,
    pub max: u32,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("quota_arbiter");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Reservation decisions by quota, flow, outcome and mode",
            decisions.clone(),
        );
        let would_defer = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "would_defer",
            "Observe-mode grants that enforcement would have deferred",
            would_defer.clone(),
        );
        let reserve_seconds = Histogram::new(exponential_buckets(0.0002, 2.0, 16));
        registry.register(
            "reserve_duration_seconds",
            "Time spent in the store's conditional upsert, per decision",
            reserve_seconds.clone(),
        );
        // From 50 µs (a free turn) to 1.6 s, near the longest store time
        // limit (1.9 s); a wait past the limit is a `claim_work` store error.
        let claim_wait_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 16));
        registry.register(
            "claim_wait_seconds",
            "Time a group of claims waited for its turn among the open claim transactions (at most half the pool), per group",
            claim_wait_seconds.clone(),
        );
        let store_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Store operations that failed or timed out",
            store_errors.clone(),
        );
        let background_restarts = Family::<TaskLabels, Counter>::default();
        registry.register(
            "background_restarts",
            "Background tasks (catalog sync and listener, pruning, tally flush) started again after a panic",
            background_restarts.clone(),
        );
        let catalog_age_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "catalog_age_seconds",
            "Seconds since this replica's catalog was last read from the store (-1 before the first read)",
            catalog_age_seconds.clone(),
        );
        let catalog_stale_after_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "catalog_stale_after_seconds",
            "The bound past which this replica's catalog is stale: not ready, enforced decisions fail closed",
            catalog_stale_after_seconds.clone(),
        );
        let store_synchronous = Gauge::default();
        registry.register(
            "store_synchronous",
            "1 when the store's commits wait for a synchronous standby (a failover loses no answered grant), 0 otherwise",
            store_synchronous.clone(),
        );
        let store_timeline = Gauge::default();
        registry.register(
            "store_timeline",
            "The store's timeline as last read: a promoted standby raises it",
            store_timeline.clone(),
        );
        let store_new_primaries = Counter::default();
        registry.register(
            "store_new_primaries",
            "Times this replica found the store answering from a new timeline (a failover)",
            store_new_primaries.clone(),
        );
        let background_failures = Family::<TaskLabels, Counter>::default();
        registry.register(
            "background_failures",
            "Background tasks' runs that failed at the store (a sync, a listener, a flush or a pruning step) and will be tried again",
            background_failures.clone(),
        );
        let flow_mode = Family::<FlowModeLabels, Gauge>::default();
        registry.register(
            "flow_mode",
            "1 for each flow's current mode, 0 for the others: flips show as steps",
            flow_mode.clone(),
        );
        let flow_enforce_percent = Family::<FlowLabels, Gauge>::default();
        registry.register(
            "flow_enforce_percent",
            "Share (percent) of a flow's over-ceiling decisions deferred: 100 enforced, 1-99 partly enforced, 0 in observe or count",
            flow_enforce_percent.clone(),
        );
        let window_slots_spent = Family::<WindowLabels, Gauge>::default();
        // Not `window_count`: a `_count` suffix belongs to histograms and summaries.
        registry.register(
            "window_slots_spent",
            "Slots spent in the current window, by quota and period",
            window_slots_spent.clone(),
        );
        let window_ceiling = Family::<WindowLabels, Gauge>::default();
        registry.register(
            "window_ceiling",
            "Ceiling of each window of each quota, by quota and period",
            window_ceiling.clone(),
        );
        let pool_connections = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "db_pool_connections",
            "PostgreSQL pool connections of this replica, by state",
            pool_connections.clone(),
        );
        let pool_max_connections = Gauge::default();
        registry.register(
            "db_pool_max_connections",
            "Size limit of this replica's PostgreSQL pool",
            pool_max_connections.clone(),
        );
        let effective_rate = Family::<QuotaLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cadence_effective_rate",
            "Cadence tokens per second in force, after adaptive shrinking",
            effective_rate.clone(),
        );
        let effective_burst = Family::<QuotaLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cadence_effective_burst",
            "Cadence bucket size in force, after adaptive shrinking",
            effective_burst.clone(),
        );
        let mut admission = Registry::with_prefix("quota");
        let admits = Family::<AdmitLabels, Counter>::default();
        admission.register(
            "admit",
            "Admission answers by route class and outcome (admitted, caller_rate_limited, capacity_exhausted, store_unavailable)",
            admits.clone(),
        );
        let capacity_error_budget = Family::<RouteClassLabels, Gauge<f64, AtomicU64>>::default();
        admission.register(
            "admit_capacity_error_budget",
            "Each route class's capacity_error_budget: the share of its admissions that may be refused for capacity before the alert",
            capacity_error_budget.clone(),
        );
        let admit_seconds = Histogram::new(exponential_buckets(0.0002, 2.0, 16));
        admission.register(
            "admit_duration_seconds",
            "Time spent in the store's admission statement, per statement (one decides a group of concurrent admissions)",
            admit_seconds.clone(),
        );
        let metrics = Instruments {
            registry: Arc::new(registry),
            admission: Arc::new(admission),
            admits,
            capacity_error_budget,
            admit_seconds,
            effective_rate,
            effective_burst,
            flow_mode,
            flow_enforce_percent,
            window_slots_spent,
            window_ceiling,
            pool_connections,
            pool_max_connections,
            decisions,
            would_defer,
            reserve_seconds,
            claim_wait_seconds,
            store_errors,
            background_restarts,
            background_failures,
            catalog_age_seconds,
            catalog_stale_after_seconds,
            store_synchronous,
            store_timeline,
            store_new_primaries,
        };
        for operation in STORE_OPERATIONS {
            let labels = OperationLabels {
                operation: operation.to_string(),
            };
            create_at_zero(&metrics.store_errors, &labels);
        }
        for outcome in outcomes_in(None) {
            let labels = DecisionLabels::new("", UNKNOWN_FLOW, *outcome, None);
            create_at_zero(&metrics.decisions, &labels);
        }
        Self(Arc::new(metrics))
    }

    pub fn record_decision(&self, decision: &Decision, known_flow: bool) {
        let labels = DecisionLabels::new(
            decision.quota.as_deref().unwrap_or_default(),
            if known_flow {
                &decision.flow
            } else {
                UNKNOWN_FLOW
            },
            decision.outcome,
            decision.mode,
        );
        if decision.would_defer {
            self.would_defer.get_or_create(&labels).inc();
        }
        self.decisions.get_or_create(&labels).inc();
    }

    /// One admission answer of a route class the catalog knows
    /// ([`UNKNOWN_ROUTE_CLASS`] before the catalog is loaded).
    pub(crate) fn record_admit(
        &self,
        route_class: &str,
        outcome: crate::domain::admission::Outcome,
    ) {
        self.admits
            .get_or_create(&AdmitLabels {
                route_class: route_class.to_string(),
                outcome: outcome.label().to_string(),
            })
            .inc();
    }

    pub(crate) fn record_admit_seconds(&self, seconds: f64) {
        self.admit_seconds.observe(seconds);
    }

    /// Creates, at zero, the admission counters of every route class.
    pub(crate) fn register_route_classes<'a>(
        &self,
        classes: impl IntoIterator<Item = &'a crate::domain::admission::RouteClass>,
    ) {
        // A class deleted since has no budget left to alert on.
        self.capacity_error_budget.clear();
        for class in classes {
            let route_class = class.name.as_str();
            let labels = RouteClassLabels {
                route_class: route_class.to_string(),
            };
            let budget = class.settings.capacity_error_budget;
            self.capacity_error_budget
                .get_or_create(&labels)
                .set(budget);
            for outcome in crate::domain::admission::Outcome::ALL {
                let labels = AdmitLabels {
                    route_class: route_class.to_string(),
                    outcome: outcome.label().to_string(),
                };
                create_at_zero(&self.admits, &labels);
            }
        }
    }

    pub fn record_reserve_seconds(&self, seconds: f64) {
        self.reserve_seconds.observe(seconds);
    }

    pub(crate) fn record_claim_wait(&self, waited: std::time::Duration) {
        self.claim_wait_seconds.observe(waited.as_secs_f64());
    }

    /// A supervised background task (`crate::supervise`): its restarts
    /// counted from zero.
    pub(crate) fn count_background_restarts(&self, task: &'static str) {
        create_at_zero(&self.background_restarts, &TaskLabels { task });
        create_at_zero(&self.background_failures, &TaskLabels { task });
    }

    /// A background task's run that failed at the store; it tries again.
    pub(crate) fn record_background_failure(&self, task: &'static str) {
        self.background_failures
            .get_or_create(&TaskLabels { task })
            .inc();
    }

    pub(crate) fn record_background_restart(&self, task: &'static str) {
        self.background_restarts
            .get_or_create(&TaskLabels { task })
            .inc();
    }

    /// How old the replica's catalog is (`None`: never read), against its bound.
    pub(crate) fn set_catalog_age(
        &self,
        age: Option<std::time::Duration>,
        stale_after: std::time::Duration,
    ) {
        let age = age.map_or(-1.0, |age| age.as_secs_f64());
        self.catalog_age_seconds.set(age);
        self.catalog_stale_after_seconds
            .set(stale_after.as_secs_f64());
    }

    /// The store's durability and timeline, as last read.
    pub(crate) fn set_durability(&self, synchronous: bool, timeline: Option<i32>) {
        self.store_synchronous.set(i64::from(synchronous));
        if let Some(timeline) = timeline {
            self.store_timeline.set(i64::from(timeline));
        }
    }

    pub(crate) fn record_new_primary(&self) {
        self.store_new_primaries.inc();
    }

    pub fn store_error(&self, operation: &str) {
        debug_assert!(
            STORE_OPERATIONS.contains(&operation),
            "store operation `{operation}` is missing from STORE_OPERATIONS, so it has no series before its first error"
        );
        self.store_errors
            .get_or_create(&OperationLabels {
                operation: operation.to_string(),
            })
            .inc();
    }

    /// Creates, at zero, the decision counters every flow of the catalog can
    /// move in any mode, so a flip starts new series from zero, not from nothing.
    fn register_flows(&self, flows: &[FlowRule]) {
        for flow in flows {
            for mode in [Mode::Observe, Mode::Enforce, Mode::Count] {
                for outcome in outcomes_in(Some(mode)) {
                    let labels = DecisionLabels::new(&flow.quota, &flow.name, *outcome, Some(mode));
                    create_at_zero(&self.decisions, &labels);
                }
            }
            for mode in MODES_THAT_WOULD_DEFER {
                let labels =
                    DecisionLabels::new(&flow.quota, &flow.name, Outcome::Granted, Some(mode));
                create_at_zero(&self.would_defer, &labels);
            }
        }
    }

    /// Sets the gauges that describe state rather than events, just before a
    /// scrape, and creates the counters of flows the catalog now has.
    pub fn set_state(&self, flows: &[FlowRule], usage: Option<&[WindowUsage]>, pool: PoolReading) {
        self.register_flows(flows);
        self.flow_mode.clear();
        self.flow_enforce_percent.clear();
        for flow in flows {
            let enforced = if flow.mode == Mode::Enforce {
                flow.enforce_percent
            } else {
                0
            };
            let labels = FlowLabels {
                flow: flow.name.clone(),
                quota: flow.quota.clone(),
            };
            self.flow_enforce_percent
                .get_or_create(&labels)
                .set(i64::from(enforced));
            for mode in [Mode::Observe, Mode::Enforce, Mode::Count] {
                let labels = FlowModeLabels {
                    flow: flow.name.clone(),
                    quota: flow.quota.clone(),
                    mode: mode.as_str().to_string(),
                };
                self.flow_mode
                    .get_or_create(&labels)
                    .set(i64::from(flow.mode == mode));
            }
        }
        // Without a fresh reading, no number beats a stale one.
        self.window_slots_spent.clear();
        self.window_ceiling.clear();
        self.effective_rate.clear();
        self.effective_burst.clear();
        for window in usage.unwrap_or_default() {
            let labels = QuotaLabels {
                quota: window.quota.clone(),
            };
            let per_window = WindowLabels {
                quota: window.quota.clone(),
                period: window.period.clone(),
            };
            self.window_slots_spent
                .get_or_create(&per_window)
                .set(window.count);
            self.window_ceiling
                .get_or_create(&per_window)
                .set(window.ceiling);
            if let (Some(rate), Some(burst)) = (window.effective_rate, window.effective_burst) {
                self.effective_rate.get_or_create(&labels).set(rate);
                self.effective_burst.get_or_create(&labels).set(burst);
            }
        }
        let (size, idle) = (i64::from(pool.open), pool.idle as i64);
        let state = |s: &str| PoolLabels {
            state: s.to_string(),
        };
        self.pool_connections
            .get_or_create(&state("idle"))
            .set(idle);
        self.pool_connections
            .get_or_create(&state("in_use"))
            .set(size - idle);
        self.pool_max_connections.set(i64::from(pool.max));
    }

    /// The exposition in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut open_metrics = String::new();
        // Writing into a String cannot fail.
        let _ =
            prometheus_client::encoding::text::encode_registry(&mut open_metrics, &self.registry);
        let mut admission = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut admission, &self.admission);
        prometheus_text(&open_metrics) + &prometheus_text(&admission)
    }
}

fn create_at_zero<L: Clone + std::hash::Hash + Eq>(family: &Family<L, Counter>, labels: &L) {
    family.get_or_create(labels).inc_by(0);
}

/// prometheus_client writes OpenMetrics, where a counter family is named
/// without the `_total` its samples carry. The Prometheus text format names a
/// family exactly like its samples (otherwise its samples read as untyped
/// metrics without help) and has no `# EOF` or `# UNIT` lines.
fn prometheus_text(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len() + 256);
    let mut help: Option<&str> = None;
    for line in open_metrics.lines() {
        if let Some(described) = line.strip_prefix("# HELP ") {
            // Written with the TYPE line, once the family's type is known.
            help = Some(described);
        } else if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (name, kind) = typed.rsplit_once(' ').unwrap_or((typed, "untyped"));
            let name: Cow<str> = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total").into()
            } else {
                name.into()
            };
            if let Some(text) = help.take().and_then(|h| h.split_once(' ')).map(|(_, t)| t) {
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
        } else if line != "# EOF" && !line.starts_with("# UNIT ") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::prometheus_text;

    #[test]
    fn open_metrics_becomes_prometheus_text() {
        let open_metrics = "# HELP qa_decisions Decisions.\n\
                            # TYPE qa_decisions counter\n\
                            # UNIT qa_decisions decisions\n\
                            qa_decisions_total 1\n\
                            # HELP qa_seconds_total Seconds.\n\
                            # TYPE qa_seconds_total counter\n\
                            qa_seconds_total 2\n\
                            # EOF\n";
        let want = "# HELP qa_decisions_total Decisions.\n\
                    # TYPE qa_decisions_total counter\n\
                    qa_decisions_total 1\n\
                    # HELP qa_seconds_total Seconds.\n\
                    # TYPE qa_seconds_total counter\n\
                    qa_seconds_total 2\n";
        assert_eq!(prometheus_text(open_metrics), want);
    }
}
