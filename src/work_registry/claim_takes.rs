//! Claims on one quota share one take (design.md §9). Every claim of an
//! enforced quota contends for its window row, so claims' takes are gathered
//! (`gather.rs`): while one take for a quota runs, the takes of claims that
//! arrive queue, and the next statement takes for all of them; each claim
//! then gets up to what it wanted, first come first served
//! (`rationing::share_up_to`).
//!
//! The group's statement runs through the shell (time limit, latency, one
//! store error; a late answer goes back whole). Each claim waits for its
//! share through the shell too (`Shell::wait_detached`: only its own wait
//! running out is counted), within its own budget and detached: a claim
//! that stops waiting has its share given back once it arrives, and so does
//! a share the leader could not hand to anyone: an over-count in between,
//! never an under-count.

use super::WorkRegistry;
use crate::domain::catalog::QuotaRule;
use crate::domain::rationing::share_up_to;
use crate::shell::gather::{fail_all, Gather, Reply};
use crate::shell::{Operation, Shell};
use crate::store::StoreError;
use crate::store::Take;

pub(crate) struct TakeWaiter {
    want: i64,
    reply: Reply<Take>,
}

/// Queues by quota and the share of its windows its takes may reach (claims
/// of workers with different flows may have different headroom shares); a
/// group is taken by the quota's rule as its latest arrival saw it.
pub(crate) type ClaimTakes = Gather<(String, Option<i16>), QuotaRule, TakeWaiter>;

impl WorkRegistry {
    /// Up to `want` slots of `quota`, never past `share` of any window, for
    /// one claim, taken together with the concurrent claims of the quota.
    pub(super) async fn take_for_claim(
        &self,
        shell: &Shell,
        quota: &QuotaRule,
        want: i64,
        share: Option<i16>,
    ) -> Result<Take, StoreError> {
        let key = (quota.name.clone(), share);
        let waiter = |reply| TakeWaiter { want, reply };
        let lead = |key| self.clone().lead_claim_takes(key);
        let share = self.claim_takes.ask(key, quota.clone(), waiter, lead);
        // The claim's own wait: its budget, and its share given back if it
        // stops waiting (not a statement: the leader's is measured and its
        // failure counted once).
        let settle = self.reservations.giving_back(&quota.name);
        shell
            .wait_detached(Operation::ClaimWork, share, settle)
            .await
    }

    /// Takes for the quota's queue, group after group, until nobody waits.
    #[tracing::instrument(skip(self), fields(quota = %key.0))]
    async fn lead_claim_takes(self, key: (String, Option<i16>)) {
        let (name, share) = &key;
        while let Some((rule, group)) = self.claim_takes.next_group(&key) {
            let wants: Vec<i64> = group.iter().map(|waiter| waiter.want).collect();
            let wanted = wants.iter().sum();
            let (store, share) = (self.store.clone(), *share);
            let taken = async move { store.take_for_claim(&rule, wanted, share).await };
            // One statement, one latency and at most one store error for the
            // group; an answer that comes after the time limit goes back.
            let settle = self.reservations.giving_back(name);
            let take = match self
                .shell
                .run_detached(Operation::TakeSlots, taken, settle)
                .await
            {
                Ok(take) => take,
                Err(error) => {
                    fail_all(group.into_iter().map(|waiter| waiter.reply), &error);
                    continue;
                }
            };
            for (waiter, share) in group.into_iter().zip(share_up_to(&wants, take.taken)) {
                if let Err(Ok(unheard)) = waiter.reply.send(Ok(take.share_of(share, waiter.want))) {
                    self.store
                        .give_back_unused(name, &unheard.windows, unheard.taken)
                        .await;
                }
            }
        }
    }
}
