//! Deadline bypass (design.md §2): work due within the bypass horizon outranks
//! the quota. This path is deliberately not handed the reservation store, so it
//! cannot call the reservation, and a broken store cannot hold it back. The
//! slots it spends are counted after the fact.

use std::time::Duration;

use chrono::Utc;

use crate::catalog::Catalog;
use crate::clock::DbClock;
use crate::domain::decision::{Decision, Outcome, SlotRequest};
use crate::metrics::Metrics;
use crate::tally::Ledger;

#[derive(Clone)]
pub struct BypassDesk {
    catalog: Catalog,
    ledger: Ledger,
    clock: DbClock,
    metrics: Metrics,
    horizon: chrono::Duration,
}

impl BypassDesk {
    pub fn new(
        catalog: Catalog,
        ledger: Ledger,
        clock: DbClock,
        metrics: Metrics,
        horizon: Duration,
    ) -> Self {
        Self {
            catalog,
            ledger,
            clock,
            metrics,
            horizon: chrono::Duration::from_std(horizon).unwrap_or(chrono::Duration::MAX),
        }
    }

    /// Grants the request as `bypassed` when its deadline is within the
    /// horizon; `None` sends it down the normal path.
    pub(crate) fn try_bypass(&self, request: &SlotRequest) -> Option<Decision> {
        self.is_due(request).then(|| self.grant(request))
    }

    /// Whether the request's deadline is within the bypass horizon.
    pub(crate) fn is_due(&self, request: &SlotRequest) -> bool {
        let Some(deadline) = request.deadline else {
            return false;
        };
        // The database clock as last read; only before the very first reading
        // (store never reached) does the replica's own clock stand in.
        let now = self.clock.now().unwrap_or_else(Utc::now);
        deadline - now <= self.horizon
    }

    /// The horizon in seconds, for callers that select due work in SQL by
    /// database time and for the share event's `bypass_horizon_seconds`.
    pub fn horizon_seconds(&self) -> f64 {
        self.horizon.num_milliseconds() as f64 / 1e3
    }

    /// Grants due work as `bypassed`: counted after the fact, flagged in the
    /// log, the metrics and the tallies. The caller has checked the horizon.
    pub fn grant(&self, request: &SlotRequest) -> Decision {
        let mut decision = Decision::new(Outcome::Bypassed, &request.flow);
        decision.window_start = self.clock.window_start();
        decision.hour_start = decision.window_start;
        let rule = self.catalog.snapshot().and_then(|s| s.rule(&request.flow));
        if let Some(rule) = &rule {
            // The quota's policy is named; nothing is said of what is left
            // (this path never reads the count, design.md §4).
            decision = decision.with_ceilings(rule.quotas(), rule.flow.priority);
            decision.quota = Some(rule.quota.name.clone());
            decision.mode = Some(rule.flow.mode);
            let spent_at = self.clock.spent_at();
            for (quota, amount) in rule.quotas().zip(request.amounts(rule)) {
                self.ledger
                    .spend_after_the_fact(&quota.name, spent_at, amount);
            }
        }
        tracing::info!(
            flow = %request.flow,
            quota = decision.quota.as_deref().unwrap_or(""),
            count = request.count,
            deadline = %request.deadline.map(|d| d.to_string()).unwrap_or_default(),
            reference = request.reference.as_deref().unwrap_or(""),
            "deadline bypass: granted outside the quota"
        );
        self.metrics.record_decision(&decision, rule.is_some());
        self.ledger.tally(&decision, true);
        decision
    }
}
