//! Prometheus metrics. Label values come from the catalog, never straight from
//! a caller, so a stream of made-up flow names cannot blow up cardinality.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::catalog::{FlowRule, Mode};
use crate::decision::Decision;

/// Flow label used for every flow the catalog does not know.
pub const UNKNOWN_FLOW: &str = "_unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    quota: String,
    flow: String,
    outcome: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowModeLabels {
    flow: String,
    quota: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    state: String,
}

/// Current usage of one quota's window, as read at scrape time.
pub struct WindowUsage {
    pub quota: String,
    pub count: i64,
    pub hourly_ceiling: i64,
    /// Cadence in force (after adaptive shrinking), when the quota has one.
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
}

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    decisions: Family<DecisionLabels, Counter>,
    would_defer: Family<DecisionLabels, Counter>,
    reserve_seconds: Histogram,
    store_errors: Family<OperationLabels, Counter>,
    flow_mode: Family<FlowModeLabels, Gauge>,
    window_count: Family<QuotaLabels, Gauge>,
    window_ceiling: Family<QuotaLabels, Gauge>,
    pool_connections: Family<PoolLabels, Gauge>,
    pool_max_connections: Gauge,
    effective_rate: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
    effective_burst: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
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
        let store_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Store operations that failed or timed out",
            store_errors.clone(),
        );
        let flow_mode = Family::<FlowModeLabels, Gauge>::default();
        registry.register(
            "flow_mode",
            "1 for each flow's current mode, 0 for the others: flips show as steps",
            flow_mode.clone(),
        );
        let window_count = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "window_count",
            "Slots spent in the current UTC-hour window, by quota",
            window_count.clone(),
        );
        let window_ceiling = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "window_ceiling",
            "Hourly ceiling of each quota",
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
        Self {
            registry: Arc::new(registry),
            effective_rate,
            effective_burst,
            flow_mode,
            window_count,
            window_ceiling,
            pool_connections,
            pool_max_connections,
            decisions,
            would_defer,
            reserve_seconds,
            store_errors,
        }
    }

    pub fn record_decision(&self, decision: &Decision, known_flow: bool) {
        let labels = DecisionLabels {
            quota: decision.quota.clone().unwrap_or_default(),
            flow: if known_flow {
                decision.flow.clone()
            } else {
                UNKNOWN_FLOW.to_string()
            },
            outcome: decision.outcome.as_str().to_string(),
            mode: decision
                .mode
                .map(|m| m.as_str())
                .unwrap_or_default()
                .to_string(),
        };
        if decision.would_defer {
            self.would_defer.get_or_create(&labels).inc();
        }
        self.decisions.get_or_create(&labels).inc();
    }

    pub fn observe_reserve(&self, seconds: f64) {
        self.reserve_seconds.observe(seconds);
    }

    pub fn store_error(&self, operation: &str) {
        self.store_errors
            .get_or_create(&OperationLabels {
                operation: operation.to_string(),
            })
            .inc();
    }

    /// Sets the gauges that describe state rather than events, just before a scrape.
    pub fn set_state(
        &self,
        flows: &[FlowRule],
        usage: Option<&[WindowUsage]>,
        pool: &sqlx::PgPool,
    ) {
        self.flow_mode.clear();
        for flow in flows {
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
        self.window_count.clear();
        self.window_ceiling.clear();
        self.effective_rate.clear();
        self.effective_burst.clear();
        for window in usage.unwrap_or_default() {
            let labels = QuotaLabels {
                quota: window.quota.clone(),
            };
            self.window_count.get_or_create(&labels).set(window.count);
            self.window_ceiling
                .get_or_create(&labels)
                .set(window.hourly_ceiling);
            if let (Some(rate), Some(burst)) = (window.effective_rate, window.effective_burst) {
                self.effective_rate.get_or_create(&labels).set(rate);
                self.effective_burst.get_or_create(&labels).set(burst);
            }
        }
        let (size, idle) = (i64::from(pool.size()), pool.num_idle() as i64);
        let state = |s: &str| PoolLabels {
            state: s.to_string(),
        };
        self.pool_connections
            .get_or_create(&state("idle"))
            .set(idle);
        self.pool_connections
            .get_or_create(&state("in_use"))
            .set(size - idle);
        self.pool_max_connections
            .set(i64::from(pool.options().get_max_connections()));
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
