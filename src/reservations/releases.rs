//! Releases and upstream reports coalesced (design.md §8). Every release
//! frees a place and folds its hold time into its flow's average, one row
//! per flow; every upstream report adapts its quota's factor, one bucket row
//! per quota. A statement per ask would queue every worker on those rows
//! (and a place being freed stays locked meanwhile, so concurrent takes,
//! which skip locked places, see it as held). Concurrent asks of this
//! replica, whatever their quota, are gathered instead: one statement per
//! group frees the group's places and folds each flow's samples, or folds
//! each quota's statuses, in the order they came — what one after the other
//! would leave.

use crate::shell::gather::{in_rounds, Batched};
use crate::store::{AdaptedCadence, LeaseRelease, ReleaseAsk, Store, StoreError};

#[derive(Clone)]
pub(crate) struct Releases {
    store: Store,
    releases: Batched<ReleaseAsk, LeaseRelease>,
    reports: Batched<(String, u16), Option<AdaptedCadence>>,
}

impl Releases {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            releases: Batched::default(),
            reports: Batched::default(),
        }
    }

    /// Frees `ask`'s lease together with whoever else is releasing now.
    pub(crate) async fn release(&self, ask: ReleaseAsk) -> Result<LeaseRelease, StoreError> {
        let store = self.store.clone();
        let group = move |asks: Vec<ReleaseAsk>| release_group(store.clone(), asks);
        self.releases.ask(ask, group).await
    }

    /// Adapts `quota`'s cadence to an upstream's `status` together with
    /// whoever else is reporting now.
    pub(crate) async fn report(
        &self,
        quota: String,
        status: u16,
    ) -> Result<Option<AdaptedCadence>, StoreError> {
        let store = self.store.clone();
        let group = move |reports: Vec<(String, u16)>| {
            let store = store.clone();
            async move { Ok(store.adapt_cadences(&reports).await?) }
        };
        self.reports.ask((quota, status), group).await
    }
}

/// Releases a group: a statement per round of distinct leases (the first
/// release of each lease, then the second, …), so that a repeat finds the
/// lease freed by the first and hears "not held", as it would alone.
async fn release_group(
    store: Store,
    asks: Vec<ReleaseAsk>,
) -> Result<Vec<LeaseRelease>, StoreError> {
    in_rounds(
        &asks,
        |ask| ask.lease_id,
        |round| {
            let store = store.clone();
            async move { Ok(store.release_leases(&round).await?) }
        },
    )
    .await
}
