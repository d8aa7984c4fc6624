//! The work registry (design.md §7): work enqueued, claimed by workers in
//! rationing order across every worker, done or released. A claim of an
//! enforced flow takes its quota's slots (and decides its items' answers as
//! reservations do, `crate::reservations`); every store call goes through
//! the shell (`crate::shell`).

mod claim;
mod claim_groups;
mod claim_takes;
mod enqueues;

use crate::catalog::Catalog;
use crate::metrics::Metrics;
use crate::reservations::Reservations;
use crate::shell::Shell;
use crate::store::Store;

pub use claim::{Claim, ClaimOutcome, ClaimRequest, ClaimedItem, MAX_CLAIM};

#[derive(Clone)]
pub struct WorkRegistry {
    store: Store,
    catalog: Catalog,
    metrics: Metrics,
    shell: Shell,
    /// A claim's items are decided as reservations are: spent, observed,
    /// counted and tallied by the same rules.
    reservations: Reservations,
    claim_takes: claim_takes::ClaimTakes,
    claim_groups: claim_groups::ClaimGroups,
    busy_lanes: claim::BusyLanes,
    enqueues: enqueues::Enqueues,
    finishes: enqueues::Finishes,
}

impl WorkRegistry {
    pub(crate) fn new(
        store: Store,
        catalog: Catalog,
        metrics: Metrics,
        shell: Shell,
        reservations: Reservations,
    ) -> Self {
        Self {
            store,
            catalog,
            metrics,
            shell,
            reservations,
            claim_takes: Default::default(),
            claim_groups: Default::default(),
            busy_lanes: Default::default(),
            enqueues: Default::default(),
            finishes: Default::default(),
        }
    }
}
