//! Reservations (design.md §9): a flow's decision — catalog lookup, then
//! (for observe and enforce) the store's conditional upsert, coalesced with
//! concurrent ones of the same quota — and a batch's; the in-flight places a
//! grant holds and their release; the feedback that adapts a quota's cadence;
//! slots a worker client spent on its own. Every store call goes through the
//! shell (`crate::shell`).

mod batch;
mod coalesce;
mod leases;
mod observe;
mod releases;
mod settlements;
mod shares;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::catalog::Catalog;
use crate::clock::DbClock;
use crate::domain::catalog::{Handling, Rule};
use crate::domain::decision::{Decision, Outcome, SlotRequest};
use crate::metrics::Metrics;
use crate::shell::{Operation, Shell};
use crate::store::{Store, StoreError, Take};
use crate::tally::Ledger;

use coalesce::Coalescer;

pub use batch::MAX_BATCH_ITEMS;
pub(crate) use settlements::{SettleError, Settler};
pub use shares::SharePresence;

#[derive(Clone)]
pub struct Reservations {
    store: Store,
    catalog: Catalog,
    ledger: Ledger,
    clock: DbClock,
    metrics: Metrics,
    shell: Shell,
    /// Spreads rollout decisions of requests without a `ref`.
    unkeyed: Arc<AtomicU64>,
    coalescer: Coalescer,
    /// Releases of in-flight places and upstream reports, gathered into one
    /// statement per group.
    releases: releases::Releases,
    /// How long a reservation may be settled (design.md §12).
    settle_within: std::time::Duration,
}

impl Reservations {
    pub(crate) fn new(
        store: Store,
        catalog: Catalog,
        ledger: Ledger,
        clock: DbClock,
        metrics: Metrics,
        shell: Shell,
        settle_within: std::time::Duration,
    ) -> Self {
        Self {
            settle_within,
            coalescer: Coalescer::new(store.clone()),
            releases: releases::Releases::new(store.clone()),
            store,
            catalog,
            ledger,
            clock,
            metrics,
            shell,
            unkeyed: Arc::default(),
        }
    }

    // Debug level: a span per request costs its fields' formatting whether or
    // not an event is ever logged in it; the request span (request id, path)
    // is there at every level.
    #[tracing::instrument(level = "debug", skip(self, request), fields(flow = %request.flow, count = request.count))]
    pub async fn decide(&self, request: &SlotRequest) -> Result<Decision, StoreError> {
        let decision = match Handling::of(self.catalog.snapshot().as_deref(), &request.flow) {
            Handling::CatalogNotLoaded => return Err(crate::catalog::not_loaded()),
            Handling::Unknown => {
                return Ok(self.record(
                    Decision::new(Outcome::Unthrottled, &request.flow),
                    request.deadline.is_some(),
                    false,
                ))
            }
            Handling::Count(rule) => {
                self.count_after_the_fact(with_rule(&rule), &rule, &request.amounts(&rule))
            }
            Handling::Observe(rule) => self.observe(with_rule(&rule), &rule, request).await,
            // A stale catalog may be obeying a flag changed since: enforced
            // decisions fail closed; the others answer as in an outage.
            Handling::Enforce(_) if self.catalog.is_stale() => return Err(crate::catalog::stale()),
            Handling::Enforce(rule) => self.enforce(with_rule(&rule), &rule, request).await?,
        };
        Ok(self.record(decision, request.deadline.is_some(), true))
    }

    /// Count mode: `amounts` of `rule`'s quotas (in its order) spent after
    /// the fact, never throttled.
    pub(crate) fn count_after_the_fact(
        &self,
        mut decision: Decision,
        rule: &Rule,
        amounts: &[i64],
    ) -> Decision {
        decision.outcome = Outcome::Unthrottled;
        for (quota, &amount) in rule.quotas().zip(amounts) {
            decision.window_start = self.spend_after_the_fact(&quota.name, amount);
        }
        decision.hour_start = decision.window_start;
        decision
    }

    /// Slots spent without a reservation (count mode; a worker client's
    /// local decisions, [`Reservations::count_local_decisions`]), added to
    /// every window of the quota the database clock is in now: the ones the
    /// answer names, not those the flush lands in; unknown (no recent
    /// reading): the flush's. Returns the hour they are tallied in.
    pub fn spend_after_the_fact(&self, quota: &str, slots: i64) -> Option<DateTime<Utc>> {
        self.ledger
            .spend_after_the_fact(quota, self.clock.spent_at(), slots);
        self.clock.window_start()
    }

    /// A worker client's local decisions, reported once the arbiter answers
    /// again (design.md §12): their slots spent after the fact, and those
    /// that were due work let through at once tallied as `bypassed` for the
    /// flow. A flow that spends several quotas spent them in every one of
    /// them. Returns the window they count in.
    pub(crate) fn count_local_decisions(
        &self,
        quota: &str,
        flow: Option<&str>,
        slots: i64,
        bypasses: i64,
    ) -> Option<DateTime<Utc>> {
        let rule = flow.and_then(|flow| self.catalog.snapshot()?.rule(flow));
        let window_start = match rule.filter(Rule::spends_several) {
            Some(rule) => {
                let mut window_start = None;
                for quota in rule.quotas() {
                    window_start = self.spend_after_the_fact(&quota.name, slots);
                }
                window_start
            }
            None => self.spend_after_the_fact(quota, slots),
        };
        if let (Some(flow), 1..) = (flow, bypasses) {
            self.ledger
                .tally_reported_bypasses(window_start, quota, flow, bypasses);
        }
        window_start
    }

    async fn enforce(
        &self,
        decision: Decision,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Result<Decision, StoreError> {
        // A window whose ceiling is below 1 for the flow refuses in the take
        // itself: it computes every window's room from its locked count
        // before it writes anything (design.md §3.3).
        let reservation = self.reserve_enforced(rule, request).await?;
        let clock = reservation.clock;
        let decision = decision.counted_across(&reservation.quotas(), &clock);
        let decision = match (reservation.spent, reservation.refusal) {
            (Some(_), _) => {
                let mut decision = decision;
                decision.lease_id = reservation.lease.map(|l| l.id);
                decision.valid_until = reservation.lease.map(|l| l.valid_until);
                decision
            }
            (None, Some(refusal))
                if rollout_defers(rule.flow.enforce_percent, request, &self.unkeyed) =>
            {
                decision.deferred(&refusal, clock.db_now)
            }
            (None, None) if rollout_defers(rule.flow.enforce_percent, request, &self.unkeyed) => {
                decision.deferred_until(clock.window_end, clock.db_now)
            }
            // Gradual rollout: the rest of the refusals are granted as observed.
            (None, _) => {
                let mut decision = self.observe(decision, rule, request).await;
                decision.would_defer = true;
                decision
            }
        };
        Ok(decision)
    }

    /// Enforced decisions are coalesced with concurrent ones for the same
    /// quota: one statement per group, its cadence tokens and in-flight
    /// places included. A grant whose caller stopped waiting is undone by the
    /// coalescer.
    async fn reserve_enforced(
        &self,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Result<crate::store::Reservation, StoreError> {
        let amounts = request.amounts(rule);
        let reserved = self.coalescer.reserve(rule, &amounts, request.deadline);
        self.shell.run(Operation::Reserve, reserved).await
    }

    /// How a take of `quota` (a batch's, a claim's) that no caller heard of
    /// is settled: what it took goes back once it answers.
    pub(crate) fn giving_back(
        &self,
        quota: &str,
    ) -> impl FnOnce(Result<Take, StoreError>) -> GiveBack + Send + 'static {
        let (store, quota) = (self.store.clone(), quota.to_string());
        move |unused| Box::pin(give_back_unheard(store, quota, unused))
    }

    /// A decision made: its metrics and its tally.
    pub(crate) fn record(
        &self,
        decision: Decision,
        had_deadline: bool,
        known_flow: bool,
    ) -> Decision {
        self.metrics.record_decision(&decision, known_flow);
        self.ledger.tally(&decision, had_deadline);
        decision
    }
}

/// A give-back in flight (`Reservations::giving_back`).
type GiveBack = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Gives back a take of `quota` that no caller heard of.
async fn give_back_unheard(store: Store, quota: String, unused: Result<Take, StoreError>) {
    if let Ok(take) = unused {
        store
            .give_back_unused(&quota, &take.windows, take.taken)
            .await;
    }
}

/// A granted decision naming the flow's quota, its mode and the ceiling its
/// priority may reach (the answer's policy): what every path decides from.
pub(crate) fn with_rule(rule: &Rule) -> Decision {
    let mut decision = Decision::new(Outcome::Granted, &rule.flow.name)
        .with_ceilings(rule.quotas(), rule.flow.priority);
    decision.quota = Some(rule.quota.name.clone());
    decision.mode = Some(rule.flow.mode);
    decision
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(reference: Option<&str>) -> SlotRequest {
        SlotRequest::new("f".into(), None, None, reference.map(String::from)).unwrap()
    }

    #[test]
    fn a_full_rollout_defers_every_refusal() {
        let unkeyed = AtomicU64::new(0);
        for reference in [None, Some("inv-1"), Some("inv-2")] {
            assert!(rollout_defers(100, &refused(reference), &unkeyed));
        }
    }

    #[test]
    fn refusals_without_a_ref_are_spread_evenly_over_the_share() {
        for percent in [0, 1, 30, 99] {
            let unkeyed = AtomicU64::new(0);
            let deferred = (0..100)
                .filter(|_| rollout_defers(percent, &refused(None), &unkeyed))
                .count();
            assert_eq!(
                deferred, percent as usize,
                "any 100 in a row at {percent} %"
            );
        }
    }

    #[test]
    fn a_ref_gets_the_same_answer_every_time_by_its_hash() {
        // FNV-1a of "inv-1" is 0xe997ff8f39a31a1a: bucket 14 of 100.
        let unkeyed = AtomicU64::new(0);
        for _ in 0..3 {
            assert!(rollout_defers(15, &refused(Some("inv-1")), &unkeyed));
            assert!(!rollout_defers(14, &refused(Some("inv-1")), &unkeyed));
        }
        let share = (0..1000)
            .filter(|i| rollout_defers(30, &refused(Some(&format!("ref-{i}"))), &unkeyed))
            .count();
        assert!((250..350).contains(&share), "{share} of 1000 refs at 30 %");
    }
}
