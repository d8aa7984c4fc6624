//! Concurrent claims of the same flows share one claim (design.md §9). Every
//! claim walks the same queue heads and would lock past the items the others
//! hold, so claims are gathered (`gather.rs`) by their flows: while one
//! group's look, takes and lease run, the claims that arrive queue, and the
//! next group runs them once for all of them, with the sum of what they may
//! lease. The items leased, most urgent first, fall to the group's claims
//! first come first served, each up to its `max` (`rationing::share_up_to`),
//! and each claim decides its own items' answers from there.
//!
//! Each claim waits for its share within its own budget. A claim that stopped
//! waiting has its items released at once (pending again, claimable by the
//! next claim); the slots they spent stay counted: an over-count, never an
//! under-count.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::claim::{ClaimRequest, Lanes};
use super::WorkRegistry;
use crate::domain::catalog::Snapshot;
use crate::domain::decision::{Decision, Deferral};
use crate::shell::gather::{fail_all, Gather, Reply};
use crate::shell::Operation;
use crate::store::claim::{ClaimGroup, ClaimLane, Claimant};
use crate::store::work::{Finish, PlaceLease, RetryDelay};
use crate::store::StoreError;
use crate::store::{Take, WorkItem};

/// Claims of one group: the same flows (sorted; `None`: all) and the same
/// bypass horizon (its bits).
type GroupKey = (Option<Vec<String>>, u64);

pub(crate) struct ClaimWaiter {
    claimant: Claimant,
    reply: Reply<ClaimShare>,
}

/// Queues by group; a group is leased by the catalog as its latest arrival
/// saw it.
pub(crate) type ClaimGroups = Gather<GroupKey, Arc<Snapshot>, ClaimWaiter>;

/// What one claim of a group leased.
pub(crate) struct ClaimShare {
    /// The catalog the group was leased by: the claim decides by it too.
    pub(crate) snapshot: Arc<Snapshot>,
    /// Its items, most urgent first, with how each was decided.
    pub(crate) items: Vec<(WorkItem, ClaimLane)>,
    /// The in-flight place leases of its items, by item id.
    pub(crate) place_leases: HashMap<i64, PlaceLease>,
    /// The takes its enforced items were granted from, by lane.
    pub(crate) takes: Vec<Take>,
    /// The decisions of its measured items, by item id.
    pub(crate) measured: HashMap<i64, Decision>,
    /// For a claim that got nothing: of the limits that stopped the group's
    /// takes, the one that lifts first.
    pub(crate) lifts_first: Option<Deferral>,
}

impl WorkRegistry {
    /// Leases what `request` may have, together with the concurrent claims
    /// of the same flows.
    pub(super) async fn claim_together(
        &self,
        snapshot: Arc<Snapshot>,
        request: &ClaimRequest,
        horizon_seconds: f64,
    ) -> Result<ClaimShare, StoreError> {
        let mut flows = request.flow_names();
        if let Some(flows) = &mut flows {
            flows.sort_unstable();
            flows.dedup();
        }
        let key = (flows, horizon_seconds.to_bits());
        let claimant = Claimant {
            worker: request.worker.clone(),
            max: request.max,
            lease_seconds: request.lease.as_secs_f64(),
        };
        let waiter = |reply| ClaimWaiter { claimant, reply };
        let lead = |key| self.clone().lead_claims(key);
        let answer = self.claim_groups.ask(key, snapshot, waiter, lead);
        self.shell.wait(Operation::ClaimWork, answer).await
    }

    /// Leases for the group's queue, group after group, until nobody waits.
    #[tracing::instrument(skip_all)]
    async fn lead_claims(self, key: GroupKey) {
        let (flows, horizon_seconds) = (key.0.as_deref(), f64::from_bits(key.1));
        while let Some((snapshot, group)) = self.claim_groups.next_group(&key) {
            let (claimants, replies): (Vec<Claimant>, Vec<_>) =
                group.into_iter().map(|w| (w.claimant, w.reply)).unzip();
            let lanes = Lanes::new(&snapshot, flows, self.catalog.is_stale());
            let group = ClaimGroup {
                claimants: &claimants,
                worker_flows: flows,
                horizon_seconds,
            };
            let leased = self.lease_items(&lanes, group).await;
            let mut leased = match leased {
                Ok(leased) => leased,
                Err(error) => {
                    fail_all(replies, &error);
                    continue;
                }
            };
            let shares = std::mem::take(&mut leased.leases.items);
            for ((reply, items), claimant) in replies.into_iter().zip(shares).zip(&claimants) {
                let place_leases = items
                    .iter()
                    .filter_map(|(item, _)| {
                        let lease = leased.leases.place_leases.get(&item.id)?;
                        Some((item.id, *lease))
                    })
                    .collect();
                let measured = items
                    .iter()
                    .filter_map(|(item, _)| Some((item.id, leased.measured.remove(&item.id)?)))
                    .collect();
                let share = ClaimShare {
                    snapshot: snapshot.clone(),
                    items,
                    place_leases,
                    takes: leased.takes.clone(),
                    measured,
                    lifts_first: leased.lifts_first,
                };
                if let Err(Ok(unheard)) = reply.send(Ok(share)) {
                    self.release_unheard(&claimant.worker, unheard.items).await;
                }
            }
        }
    }

    /// Items leased to a claim that stopped waiting: pending again at once
    /// (with their in-flight places freed), as if its worker released them.
    async fn release_unheard(&self, worker: &str, items: Vec<(WorkItem, ClaimLane)>) {
        let now = Finish::Release(RetryDelay::After(Duration::ZERO));
        for (item, _) in items {
            if let Err(error) = self.finish_work(item.id, worker, now).await {
                tracing::warn!(item = item.id, %error, "an unheard claim's item stays leased until its lease runs out");
            }
        }
    }
}
