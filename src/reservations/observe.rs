//! Observe mode: the full reservation runs, the answer is always a grant.
//! The emission must not wait on a slow store, yet the window count stays the
//! honest record: the statement runs detached (design.md §9), so one still
//! running when the answer is due finishes in the background and its
//! would-defers join the tallies late; only a statement that fails (or is
//! given up) is counted after the fact.

use super::Reservations;
use crate::domain::catalog::Rule;
use crate::domain::decision::{Decision, SlotRequest};
use crate::shell::Operation;
use crate::store::Reservation;
use crate::store::StoreError;

impl Reservations {
    /// Attempts and counts the slots, always grants; flags what enforcement
    /// would have deferred. Spent together with every other observation in
    /// flight (the coalescer's group statement, design.md §9).
    pub(crate) async fn observe(
        &self,
        mut decision: Decision,
        rule: &Rule,
        request: &SlotRequest,
    ) -> Decision {
        match self.spend_observed(rule, request).await {
            Some(reservation) => {
                decision = decision.counted_across(&reservation.quotas(), &reservation.clock);
                decision.would_defer = reservation.refusal.is_some();
                decision.limit = reservation.refusal.map(|r| r.limit);
                decision.period = reservation
                    .refusal
                    .and_then(|r| r.period)
                    .map(|p| p.to_string());
            }
            None => {
                decision.window_start = self.clock.window_start();
                decision.hour_start = decision.window_start;
            }
        }
        decision
    }

    /// Spends the request's slots of an observed quota. `None` when the
    /// store did not answer in time: the slots are then recorded in the
    /// background (the statement's own count, or after the fact if it
    /// fails), and a would-defer in an answer that comes after all is
    /// tallied then.
    async fn spend_observed(&self, rule: &Rule, request: &SlotRequest) -> Option<Reservation> {
        let (ledger, clock) = (self.ledger.clone(), self.clock.clone());
        let (quota, flow) = (rule.quota.name.clone(), rule.flow.name.clone());
        let quotas: Vec<String> = rule.quotas().map(|q| q.name.clone()).collect();
        let (amounts, had_deadline) = (request.amounts(rule), request.deadline.is_some());
        let spent = amounts.clone();
        let settle = move |unused: Result<Reservation, StoreError>| {
            match unused {
                Ok(reservation) => {
                    if reservation.refusal.is_some() {
                        let window = reservation.clock.window_start;
                        ledger.tally_late_would_defer(window, &quota, &flow, had_deadline);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, quota, "observed decision without the store; counting after the fact");
                    // A failure is settled just before the caller answers,
                    // at this instant (a late one: just after).
                    for (quota, &amount) in quotas.iter().zip(&spent) {
                        ledger.spend_after_the_fact(quota, clock.spent_at(), amount);
                    }
                }
            }
            std::future::ready(())
        };
        let (coalescer, owned) = (self.coalescer.clone(), rule.clone());
        let observed = async move { coalescer.observe(&owned, &amounts).await };
        let spent = self
            .shell
            .run_detached(Operation::Reserve, observed, settle);
        spent
            .await
            .inspect_err(|error| tracing::warn!(%error, quota = rule.quota.name, "observed decision answered without the store"))
            .ok()
    }
}
