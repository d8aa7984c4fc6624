//! The decision path for work that is not deadline-bound: catalog lookup, then
//! (for observe and enforce) the store's conditional upsert.

mod admit;
mod batch;
mod claim;
mod claim_groups;
mod claim_takes;
mod coalesce;
mod gather;
mod observe;
mod shell;
mod work;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::catalog::Catalog;
use crate::clock::DbClock;
use crate::domain::catalog::{Mode, Rule, Snapshot};
use crate::domain::decision::{Decision, Outcome, SlotRequest};
use crate::metrics::Metrics;
use crate::store::{Deferral, Store, Take};
use crate::tally::Ledger;

use coalesce::Coalescer;
use shell::{Operation, Shell};

pub use batch::MAX_BATCH_ITEMS;
pub use claim::{Claim, ClaimOutcome, ClaimRequest, ClaimedItem, MAX_CLAIM};
/// The claim's transaction leases to the claims of a group by this rule.
pub use shell::{StoreError, StoreUnavailable, RETRY_AFTER_UNAVAILABLE};

#[derive(Clone)]
pub struct Arbiter {
    store: Store,
    catalog: Catalog,
    ledger: Ledger,
    clock: DbClock,
    metrics: Metrics,
    shell: Shell,
    /// Spreads rollout decisions of requests without a `ref`.
    unkeyed: Arc<AtomicU64>,
    coalescer: Coalescer,
    admissions: admit::Admissions,
    claim_takes: claim_takes::ClaimTakes,
    claim_groups: claim_groups::ClaimGroups,
    busy_lanes: claim::BusyLanes,
    enqueues: work::Enqueues,
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
            shell: Shell::new(
                metrics.clone(),
                clock.clone(),
                ledger.clone(),
                store_timeout,
            ),
            store,
            catalog,
            ledger,
            clock,
            metrics,
            unkeyed: Arc::default(),
            admissions: Default::default(),
            claim_takes: Default::default(),
            claim_groups: Default::default(),
            busy_lanes: Default::default(),
            enqueues: Default::default(),
        }
    }

    // Debug level: a span per request costs its fields' formatting whether or
    // not an event is ever logged in it; the request span (request id, path)
    // is there at every level.
    #[tracing::instrument(level = "debug", skip(self, request), fields(flow = %request.flow, count = request.count))]
    pub async fn decide(&self, request: &SlotRequest) -> Result<Decision, StoreError> {
        let decision = match Handling::of(self.catalog.snapshot().as_deref(), &request.flow) {
            Handling::CatalogNotLoaded => return Err(catalog_not_loaded()),
            Handling::Unknown => {
                return Ok(self.settle(
                    Decision::new(Outcome::Unthrottled, &request.flow),
                    request.deadline.is_some(),
                    false,
                ))
            }
            Handling::Count(rule) => {
                self.count_after_the_fact(with_rule(&rule), &rule, request.count)
            }
            Handling::Observe(rule) => self.observe(with_rule(&rule), &rule, request).await,
            Handling::Enforce(rule) => self.enforce(with_rule(&rule), &rule, request).await?,
        };
        Ok(self.settle(decision, request.deadline.is_some(), true))
    }

    fn count_after_the_fact(&self, mut decision: Decision, rule: &Rule, count: i64) -> Decision {
        decision.outcome = Outcome::Unthrottled;
        decision.window_start = self.spend_after_the_fact(&rule.quota.name, count);
        decision
    }

    /// Slots spent without a reservation (count mode; a worker client's
    /// local decisions, [`Arbiter::count_local_decisions`]), added to the
    /// window the database clock is in now: the one the answer names, not
    /// the one the flush lands in; unknown (no recent reading): the flush's.
    /// Returns that window.
    pub fn spend_after_the_fact(&self, quota: &str, slots: i64) -> Option<DateTime<Utc>> {
        let window_start = self.clock.window_start();
        self.ledger.spend_after_the_fact(quota, window_start, slots);
        window_start
    }

    /// A worker client's local decisions, reported once the arbiter answers
    /// again (design.md §12): their slots spent after the fact, and those
    /// that were due work let through at once tallied as `bypassed` for the
    /// flow. Returns the window they count in.
    pub fn count_local_decisions(
        &self,
        quota: &str,
        flow: Option<&str>,
        slots: i64,
        bypasses: i64,
    ) -> Option<DateTime<Utc>> {
        let window_start = self.spend_after_the_fact(quota, slots);
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
        if rule.quota.ceiling_for(rule.flow.priority) < 1 {
            // The guard runs before the upsert, whose insert branch would
            // otherwise be the only thing between a zero ceiling and a grant.
            let clock = self.read_clock().await?;
            return Ok(decision.deferred_on_budget(&clock));
        }
        let reservation = self.reserve_enforced(rule, request).await?;
        let clock = reservation.clock;
        let mut decision = match (reservation.count_after, reservation.refusal) {
            (Some(count_after), _) => {
                let mut decision = decision.counted(count_after, &clock);
                decision.lease_id = reservation.lease.map(|l| l.id);
                decision.valid_until = reservation.lease.map(|l| l.valid_until);
                decision
            }
            (None, refusal)
                if rollout_defers(rule.flow.enforce_percent, request, &self.unkeyed) =>
            {
                let refusal = refusal.unwrap_or_else(|| Deferral::budget(&clock));
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
    /// places included. A grant whose caller stopped waiting is undone by the
    /// coalescer.
    async fn reserve_enforced(
        &self,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Result<crate::store::Reservation, StoreError> {
        let reserved = self
            .coalescer
            .reserve(rule, request.count, request.deadline);
        self.shell.run(Operation::Reserve, reserved).await
    }

    /// The guard before a take for a ceiling below 1 answers a deferral
    /// until the next window: it needs the database clock.
    async fn read_clock(&self) -> Result<crate::domain::ClockReading, StoreError> {
        let clock = self.store.read_clock();
        self.shell.run(Operation::ReadClock, clock).await
    }

    /// How a take of `quota` (a batch's, a claim's) that no caller heard of
    /// is settled: what it took goes back once it answers.
    fn giving_back(
        &self,
        quota: &str,
    ) -> impl FnOnce(Result<Take, StoreError>) -> GiveBack + Send + 'static {
        let (store, quota) = (self.store.clone(), quota.to_string());
        move |unused| Box::pin(give_back_unheard(store, quota, unused))
    }

    fn settle(&self, decision: Decision, had_deadline: bool, known_flow: bool) -> Decision {
        self.metrics.record_decision(&decision, known_flow);
        self.ledger.tally(&decision, had_deadline);
        decision
    }
}

/// A give-back in flight (`Arbiter::giving_back`).
type GiveBack = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Gives back a take of `quota` that no caller heard of.
async fn give_back_unheard(store: Store, quota: String, unused: Result<Take, StoreError>) {
    if let Ok(take) = unused {
        let window = take.clock.window_start;
        store.give_back_unused(&quota, window, take.taken).await;
    }
}

/// A granted decision naming the flow's quota, its mode and the ceiling its
/// priority may reach (the answer's policy): what every path decides from.
fn with_rule(rule: &Rule) -> Decision {
    let mut decision = Decision::new(Outcome::Granted, &rule.flow.name)
        .with_ceiling(rule.quota.ceiling_for(rule.flow.priority));
    decision.quota = Some(rule.quota.name.clone());
    decision.mode = Some(rule.flow.mode);
    decision
}

/// How a decision about a flow is handled, by the replica's catalog: the one
/// rule every decision path (a reservation, a batch's items, a claim's
/// flows) dispatches on. Work due within the bypass horizon is let through
/// before any of this (`BypassDesk`).
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
    pub(crate) fn rule(&self) -> Option<&Rule> {
        match self {
            Handling::Count(rule) | Handling::Observe(rule) | Handling::Enforce(rule) => Some(rule),
            Handling::CatalogNotLoaded | Handling::Unknown => None,
        }
    }

    pub(crate) fn of(snapshot: Option<&Snapshot>, flow: &str) -> Handling {
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

/// Before the first catalog load nobody can tell an enforced flow from an
/// unknown one: the decision paths fail closed.
fn catalog_not_loaded() -> StoreError {
    StoreUnavailable("catalog not loaded yet".into()).into()
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

/// Runs `futures` together and answers their outputs in order. Each is first
/// polled in order, so decisions that queue for a group statement on their
/// first poll queue in that order.
pub(super) async fn all_at_once<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in running.iter_mut().zip(outputs.iter_mut()) {
            let Some(polled) = future.as_mut() else {
                continue;
            };
            match polled.as_mut().poll(cx) {
                Poll::Ready(value) => {
                    *output = Some(value);
                    *future = None;
                }
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future ran to its end"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(reference: Option<&str>) -> SlotRequest {
        SlotRequest::new("f".into(), None, None, reference.map(String::from)).unwrap()
    }

    #[test]
    fn a_decision_routes_by_the_catalog_and_the_flows_mode() {
        let quota = crate::domain::catalog::QuotaRule {
            name: "ppf".into(),
            hourly_ceiling: 10,
            cadence: None,
            max_in_flight: None,
            priority2_share: None,
            priority3_share: None,
        };
        let flow = |name: &str, mode| crate::domain::catalog::FlowRule {
            name: name.into(),
            quota: "ppf".into(),
            mode,
            priority: 2,
            enforce_percent: 100,
        };
        let flows = vec![
            flow("counted", Mode::Count),
            flow("observed", Mode::Observe),
            flow("enforced", Mode::Enforce),
            // A flow whose quota the snapshot lacks is no rule: unknown.
            crate::domain::catalog::FlowRule {
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
