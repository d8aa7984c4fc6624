//! Observe mode: the full reservation runs, the answer is always a grant.
//! The emission must not wait on a slow store, yet the window count stays the
//! honest record: the statement runs detached (design.md §9), so one still
//! running when the answer is due finishes in the background and its
//! would-defers join the tallies late; only a statement that fails (or is
//! given up) is counted after the fact.

use std::future::Future;

use super::rationing::{self, Ask};
use super::shell::{Operation, StoreError};
use super::Arbiter;
use crate::catalog::Rule;
use crate::decision::{Decision, SlotRequest};
use crate::store::Reservation;
use crate::tally::Ledger;

/// What to tally once a reservation answered after its decision did.
pub(super) type LateTally = Box<dyn FnOnce(&Reservation, &Ledger) + Send>;

impl Arbiter {
    /// Attempts and counts the slots, always grants; flags what enforcement
    /// would have deferred.
    pub(super) async fn observe(
        &self,
        mut decision: Decision,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Decision {
        let late = || -> LateTally {
            let (quota, flow) = (rule.quota.name.clone(), rule.flow.name.clone());
            let had_deadline = request.deadline.is_some();
            Box::new(move |reservation, ledger| {
                if reservation.refusal.is_some() {
                    let window = reservation.clock.window_start;
                    ledger.tally_late_would_defer(window, &quota, &flow, had_deadline);
                }
            })
        };
        match self.spend_observed(rule, request.count, late).await {
            Some(reservation) => {
                if let Some(count_after) = reservation.count_after {
                    decision = decision.counted(count_after, &reservation.clock);
                }
                decision.window_start = Some(reservation.clock.window_start);
                decision.would_defer = reservation.refusal.is_some();
                decision.limit = reservation.refusal.map(|r| r.limit);
            }
            None => decision.window_start = self.clock.window_start(),
        }
        decision
    }

    /// Spends `slots` of an observed quota. `None` when the store did not
    /// answer in time: the slots are then recorded in the background (the
    /// statement's own count, or after the fact if it fails), and the tally
    /// `late_tally` makes (only then) runs on an answer that comes after all.
    pub(super) async fn spend_observed(
        &self,
        rule: &Rule,
        slots: i64,
        late_tally: impl FnOnce() -> LateTally,
    ) -> Option<Reservation> {
        let (ledger, quota, tally) = (self.ledger.clone(), rule.quota.name.clone(), late_tally());
        let clock = self.clock.clone();
        let settle = move |unused: Result<Reservation, StoreError>| {
            match unused {
                Ok(reservation) => tally(&reservation, &ledger),
                Err(error) => {
                    tracing::warn!(%error, quota, "observed decision without the store; counting after the fact");
                    // A failure is settled just before the caller answers,
                    // naming this window (a late one: just after).
                    ledger.spend_after_the_fact(&quota, clock.window_start(), slots);
                }
            }
            std::future::ready(())
        };
        let observed = self.observation(rule, slots);
        let spent = self
            .shell
            .run_detached(Operation::Reserve, observed, settle);
        spent
            .await
            .inspect_err(|error| tracing::warn!(%error, quota = rule.quota.name, "observed decision answered without the store"))
            .ok()
    }

    fn observation(
        &self,
        rule: &Rule,
        slots: i64,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send + 'static {
        let (coalescer, rule) = (self.coalescer.clone(), rule.clone());
        // Spent together with every other observation of the quota in flight.
        async move { coalescer.observe(&rule, slots).await }
    }
}

/// For asks spent together, in order, by one statement that left the window
/// at `count_after`: whether each went past its own ceiling.
pub(super) fn past_ceiling(count_after: i64, asks: &[Ask]) -> Vec<bool> {
    let total: i64 = asks.iter().map(|a| a.slots).sum();
    rationing::would_defer(asks, count_after - total)
}

/// The late tally of asks spent together: `asked` holds each one's flow and
/// whether it carried a deadline.
pub(super) fn late_would_defers(
    quota: String,
    asked: Vec<(String, bool)>,
    asks: Vec<Ask>,
) -> LateTally {
    Box::new(move |reservation, ledger| {
        let Some(after) = reservation.count_after else {
            return;
        };
        let window = reservation.clock.window_start;
        let past = past_ceiling(after, &asks);
        for ((flow, had_deadline), past) in asked.iter().zip(past) {
            if past {
                ledger.tally_late_would_defer(window, &quota, flow, *had_deadline);
            }
        }
    })
}
