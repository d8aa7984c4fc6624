//! The decision path for work that is not deadline-bound: catalog lookup, then
//! (for observe and enforce) the store's conditional upsert.

mod batch;
mod claim;
mod work;

use std::time::{Duration, Instant};

use crate::catalog::{Catalog, Mode, Rule};
use crate::clock::DbClock;
use crate::decision::{Decision, Outcome, SlotRequest};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::tally::Ledger;

pub use batch::MAX_BATCH_ITEMS;
pub use claim::{Claim, ClaimOutcome, ClaimRequest, ClaimedItem, MAX_CLAIM};

/// The store could not decide in time; for an enforced flow that is a 503.
#[derive(Debug, thiserror::Error)]
#[error("quota store unavailable: {0}")]
pub struct StoreUnavailable(pub String);

#[derive(Clone)]
pub struct Arbiter {
    store: Store,
    catalog: Catalog,
    ledger: Ledger,
    clock: DbClock,
    metrics: Metrics,
    store_timeout: Duration,
}

impl Arbiter {
    pub fn new(
        store: Store,
        catalog: Catalog,
        ledger: Ledger,
        clock: DbClock,
        metrics: Metrics,
        store_timeout: Duration,
    ) -> Self {
        Self {
            store,
            catalog,
            ledger,
            clock,
            metrics,
            store_timeout,
        }
    }

    #[tracing::instrument(skip(self, request), fields(flow = %request.flow, count = request.count))]
    pub async fn decide(&self, request: &SlotRequest) -> Result<Decision, StoreUnavailable> {
        // Before the first catalog load nobody can tell an enforced flow from
        // an unknown one: fail closed rather than wave everything through.
        let snapshot = self
            .catalog
            .snapshot()
            .ok_or_else(|| StoreUnavailable("catalog not loaded yet".into()))?;
        let Some(rule) = snapshot.rule(&request.flow) else {
            return Ok(self.settle(Decision::new(Outcome::Unthrottled, &request.flow), false));
        };
        let mut decision = Decision::new(Outcome::Granted, &request.flow);
        decision.quota = Some(rule.quota.name.clone());
        decision.mode = Some(rule.flow.mode);
        let decision = match rule.flow.mode {
            Mode::Count => self.count_after_the_fact(decision, &rule, request.count),
            Mode::Observe => self.observe(decision, &rule, request.count).await,
            Mode::Enforce => self.enforce(decision, &rule, request.count).await?,
        };
        Ok(self.settle(decision, true))
    }

    fn count_after_the_fact(&self, mut decision: Decision, rule: &Rule, count: i64) -> Decision {
        self.ledger
            .spend_after_the_fact(&rule.quota.name, None, count);
        decision.outcome = Outcome::Unthrottled;
        decision.window_start = self.clock.window_start();
        decision
    }

    /// Attempts and counts the slots, always grants; flags what enforcement
    /// would have deferred. A store outage must not block the emission: the
    /// slots are then counted after the fact.
    async fn observe(&self, mut decision: Decision, rule: &Rule, count: i64) -> Decision {
        match self.reserve(rule, count, true).await {
            Ok(reservation) => {
                decision.window_start = Some(reservation.clock.window_start);
                decision.would_defer = reservation
                    .count_after
                    .is_some_and(|after| after > rule.quota.hourly_ceiling);
            }
            Err(error) => {
                tracing::warn!(%error, quota = %rule.quota.name, "observe decision without the store; counting after the fact");
                self.ledger
                    .spend_after_the_fact(&rule.quota.name, None, count);
                decision.window_start = self.clock.window_start();
            }
        }
        decision
    }

    async fn enforce(
        &self,
        decision: Decision,
        rule: &Rule,
        count: i64,
    ) -> Result<Decision, StoreUnavailable> {
        if rule.quota.hourly_ceiling < 1 {
            // The guard runs before the upsert, whose insert branch would
            // otherwise be the only thing between a zero ceiling and a grant.
            let clock = self.bounded(self.store.read_clock(), "read_clock").await?;
            let mut decision = decision.deferred_until(clock.window_end, clock.db_now);
            decision.window_start = Some(clock.window_start);
            return Ok(decision);
        }
        let reservation = self.reserve(rule, count, false).await?;
        let clock = reservation.clock;
        let mut decision = match reservation.count_after {
            Some(_) => decision,
            None => decision.deferred_until(clock.window_end, clock.db_now),
        };
        decision.window_start = Some(clock.window_start);
        Ok(decision)
    }

    async fn reserve(
        &self,
        rule: &Rule,
        count: i64,
        spend_regardless: bool,
    ) -> Result<crate::store::Reservation, StoreUnavailable> {
        let started = Instant::now();
        let reservation = self
            .bounded(
                self.store.reserve_slots(
                    &rule.quota.name,
                    count,
                    rule.quota.hourly_ceiling,
                    spend_regardless,
                ),
                "reserve_slots",
            )
            .await?;
        self.metrics
            .observe_reserve(started.elapsed().as_secs_f64());
        self.clock.observe(reservation.clock);
        Ok(reservation)
    }

    /// Runs a store call within the decision's time budget.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, sqlx::Error>>,
        operation: &str,
    ) -> Result<T, StoreUnavailable> {
        let outcome = match tokio::time::timeout(self.store_timeout, call).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => StoreUnavailable(error.to_string()),
            Err(_) => StoreUnavailable(format!("no answer within {:?}", self.store_timeout)),
        };
        self.metrics.store_error(operation);
        Err(outcome)
    }

    fn settle(&self, decision: Decision, known_flow: bool) -> Decision {
        self.metrics.record_decision(&decision, known_flow);
        self.ledger.tally(&decision);
        decision
    }
}
