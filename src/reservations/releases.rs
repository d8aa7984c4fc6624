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

use std::collections::HashMap;

use crate::shell::gather::Batched;
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

/// Releases a group, each lease once: a repeat finds it freed by the first,
/// as it would one release after the other, and hears "not held".
async fn release_group(
    store: Store,
    asks: Vec<ReleaseAsk>,
) -> Result<Vec<LeaseRelease>, StoreError> {
    let (unique, first_of) = first_of_each_lease(&asks);
    let released = store.release_leases(&unique).await?;
    Ok(first_of
        .into_iter()
        .map(|first| first.map_or(LeaseRelease::NotHeld, |i| released[i].clone()))
        .collect())
}

/// The asks with each lease once, in arrival order, and for each ask the
/// position of its lease among them if it is the lease's first ask
/// (`None`: a repeat).
fn first_of_each_lease(asks: &[ReleaseAsk]) -> (Vec<ReleaseAsk>, Vec<Option<usize>>) {
    let mut position: HashMap<i64, usize> = HashMap::new();
    let mut unique = Vec::new();
    let first_of = asks
        .iter()
        .map(|ask| {
            if position.contains_key(&ask.lease_id) {
                return None;
            }
            position.insert(ask.lease_id, unique.len());
            unique.push(ask.clone());
            Some(unique.len() - 1)
        })
        .collect();
    (unique, first_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseScope;

    fn ask(lease_id: i64) -> ReleaseAsk {
        ReleaseAsk {
            lease_id,
            held_seconds: None,
            scope: LeaseScope::default(),
        }
    }

    #[test]
    fn a_lease_asked_twice_in_a_group_is_released_once() {
        let asks: Vec<ReleaseAsk> = [7, 8, 7, 9, 8].into_iter().map(ask).collect();
        let (unique, first_of) = first_of_each_lease(&asks);
        let ids: Vec<i64> = unique.iter().map(|a| a.lease_id).collect();
        assert_eq!(ids, [7, 8, 9]);
        assert_eq!(first_of, [Some(0), Some(1), None, Some(2), None]);
    }
}
