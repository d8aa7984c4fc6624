//! Prometheus metrics. Label values come from the catalog, never straight from
//! a caller, so a stream of made-up flow names cannot blow up cardinality.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    decisions: Family<DecisionLabels, Counter>,
    would_defer: Family<DecisionLabels, Counter>,
    reserve_seconds: Histogram,
    store_errors: Family<OperationLabels, Counter>,
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
        Self {
            registry: Arc::new(registry),
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

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
