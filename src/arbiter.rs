//! The decision path for work that is not deadline-bound: catalog lookup, then
//! (for observe and enforce) the store's conditional upsert.

mod batch;
mod claim;
mod coalesce;
mod observe;
mod rationing;
mod work;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::catalog::{Catalog, Mode, Rule};
use crate::clock::DbClock;
use crate::decision::{Decision, Limit, Outcome, SlotRequest};
use crate::metrics::Metrics;
use crate::store::{Refusal, Store};
use crate::tally::Ledger;

use coalesce::Coalescer;

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
    /// Spreads rollout decisions of requests without a `ref`.
    unkeyed: Arc<AtomicU64>,
    coalescer: Coalescer,
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
            coalescer: Coalescer::new(store.clone()),
            store,
            catalog,
            ledger,
            clock,
            metrics,
            store_timeout,
            unkeyed: Arc::default(),
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
            return Ok(self.settle(
                Decision::new(Outcome::Unthrottled, &request.flow),
                request.deadline.is_some(),
                false,
            ));
        };
        let mut decision = Decision::new(Outcome::Granted, &request.flow);
        decision.quota = Some(rule.quota.name.clone());
        decision.mode = Some(rule.flow.mode);
        let decision = match rule.flow.mode {
            Mode::Count => self.count_after_the_fact(decision, &rule, request.count),
            Mode::Observe => self.observe(decision, &rule, request).await,
            Mode::Enforce => self.enforce(decision, &rule, request).await?,
        };
        Ok(self.settle(decision, request.deadline.is_some(), true))
    }

    fn count_after_the_fact(&self, mut decision: Decision, rule: &Rule, count: i64) -> Decision {
        decision.outcome = Outcome::Unthrottled;
        decision.window_start = self.clock.window_start();
        // Counted in the window the answer names, not the one the flush
        // lands in; unknown (no recent reading): the flush's.
        self.ledger
            .spend_after_the_fact(&rule.quota.name, decision.window_start, count);
        decision
    }

    async fn enforce(
        &self,
        decision: Decision,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Result<Decision, StoreUnavailable> {
        if rule.quota.ceiling_for(rule.flow.priority) < 1 {
            // The guard runs before the upsert, whose insert branch would
            // otherwise be the only thing between a zero ceiling and a grant.
            let clock = self.bounded(self.store.read_clock(), "read_clock").await?;
            let mut decision = decision.deferred_until(clock.window_end, clock.db_now);
            decision.window_start = Some(clock.window_start);
            decision.limit = Some(Limit::Budget);
            return Ok(decision);
        }
        let reservation = self.reserve_enforced(rule, request).await?;
        let clock = reservation.clock;
        let mut decision = match (reservation.count_after, reservation.refusal) {
            (Some(_), _) => {
                let mut decision = decision;
                decision.lease_id = reservation.lease.map(|l| l.id);
                decision.valid_until = reservation.lease.map(|l| l.valid_until);
                decision
            }
            (None, refusal)
                if rollout_defers(rule.flow.enforce_percent, request, &self.unkeyed) =>
            {
                let refusal = refusal.unwrap_or(Refusal {
                    limit: Limit::Budget,
                    retry_at: clock.window_end,
                });
                let mut decision = decision.deferred_until(refusal.retry_at, clock.db_now);
                decision.limit = Some(refusal.limit);
                decision
            }
            // Gradual rollout: the rest of the refusals are granted as observed.
            (None, _) => {
                let mut decision = self.observe(decision, rule, request).await;
                decision.would_defer = true;
                decision
            }
        };
        decision.window_start = Some(clock.window_start);
        Ok(decision)
    }

    /// Enforced decisions are coalesced with concurrent ones for the same
    /// quota: one statement per group, its cadence tokens and in-flight
    /// places included. A grant whose caller stopped waiting is undone.
    async fn reserve_enforced(
        &self,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Result<crate::store::Reservation, StoreUnavailable> {
        self.timed(
            self.coalescer
                .reserve(rule, request.count, request.deadline),
        )
        .await
    }

    /// Runs a reservation as a task of its own within the time budget:
    /// dropping a statement mid-flight would leave it unknown whether it
    /// spent anything. In time: its outcome (latency measured, clock kept).
    /// Too late: the task, still running, for the caller to settle.
    async fn reserve_in_budget(
        &self,
        call: impl std::future::Future<Output = Result<crate::store::Reservation, sqlx::Error>>
            + Send
            + 'static,
    ) -> Result<Result<crate::store::Reservation, sqlx::Error>, Attempt> {
        let started = Instant::now();
        let mut attempt = tokio::spawn(call);
        let Ok(joined) = tokio::time::timeout(self.store_timeout, &mut attempt).await else {
            self.metrics.store_error("reserve");
            return Err(attempt);
        };
        match joined.unwrap_or_else(|crashed| Err(sqlx::Error::Protocol(crashed.to_string()))) {
            Ok(reservation) => {
                self.metrics
                    .record_reserve_seconds(started.elapsed().as_secs_f64());
                self.clock.note(reservation.clock);
                Ok(Ok(reservation))
            }
            Err(error) => {
                self.metrics.store_error("reserve");
                Ok(Err(error))
            }
        }
    }

    /// A reservation within the time budget, its latency measured and its
    /// database clock reading kept for the paths that cannot ask.
    async fn timed(
        &self,
        call: impl std::future::Future<Output = Result<crate::store::Reservation, sqlx::Error>>,
    ) -> Result<crate::store::Reservation, StoreUnavailable> {
        let started = Instant::now();
        let reservation = self.bounded(call, "reserve").await?;
        self.metrics
            .record_reserve_seconds(started.elapsed().as_secs_f64());
        self.clock.note(reservation.clock);
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

    fn settle(&self, decision: Decision, had_deadline: bool, known_flow: bool) -> Decision {
        self.metrics.record_decision(&decision, known_flow);
        self.ledger.tally(&decision, had_deadline);
        decision
    }
}

/// A reservation still running when its answer was due.
type Attempt = tokio::task::JoinHandle<Result<crate::store::Reservation, sqlx::Error>>;

/// How long a reservation answered too late may still run before it is
/// given up (its slots then stay counted: an over-count, never an under-count).
const LATE_LIMIT: Duration = Duration::from_secs(60);

/// What a late reservation came to; `None` when it was given up.
async fn late_outcome(
    mut attempt: Attempt,
) -> Option<Result<crate::store::Reservation, sqlx::Error>> {
    match tokio::time::timeout(LATE_LIMIT, &mut attempt).await {
        Ok(joined) => Some(joined.unwrap_or_else(|c| Err(sqlx::Error::Protocol(c.to_string())))),
        Err(_) => {
            attempt.abort();
            None
        }
    }
}

/// Whether a refused decision of a flow enforced at `percent` is deferred.
/// With a `ref` the answer is the same every time (FNV-1a of the ref, mod 100);
/// without one, consecutive refusals are spread evenly over the share.
fn rollout_defers(percent: i16, request: &SlotRequest, unkeyed: &AtomicU64) -> bool {
    if percent >= 100 {
        return true;
    }
    let bucket = match &request.reference {
        Some(reference) => {
            let hash = reference.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
            hash % 100
        }
        // A stride coprime with 100: any 100 consecutive values hit every bucket once.
        None => unkeyed.fetch_add(1, Ordering::Relaxed).wrapping_mul(61) % 100,
    };
    bucket < u64::try_from(percent).unwrap_or(0)
}
