//! Releases coalesced (design.md §8). Every release frees a place and folds
//! its hold time into its flow's average, one row per flow: a statement per
//! release would queue every worker of a flow on that row while the place
//! it frees stays locked, so that concurrent takes skip it as if it were
//! held. Concurrent releases of this replica, whatever their quota, are
//! gathered instead: one statement frees the group's places and folds each
//! flow's samples in the order they came, the same average as one release
//! after the other.

use std::collections::HashSet;

use crate::shell::gather::{fail_all, Gather, Reply};
use crate::store::{LeaseRelease, ReleaseAsk, Store, StoreError};

struct Waiter {
    ask: ReleaseAsk,
    reply: Reply<LeaseRelease>,
}

/// One queue: releases of any quota share a statement.
#[derive(Clone)]
pub(crate) struct Releases {
    store: Store,
    queue: Gather<(), (), Waiter>,
}

impl Releases {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            queue: Gather::default(),
        }
    }

    /// Frees `ask`'s lease together with whoever else is releasing now.
    pub(crate) async fn release(&self, ask: ReleaseAsk) -> Result<LeaseRelease, StoreError> {
        let waiter = |reply| Waiter { ask, reply };
        let lead = |key| self.clone().lead(key);
        self.queue.ask((), (), waiter, lead).await
    }

    async fn lead(self, key: ()) {
        while let Some(((), group)) = self.queue.next_group(&key) {
            // Each lease once: a repeat in the group finds it freed by the
            // first, as it would one release after the other.
            let (first, repeats) = first_of_each_lease(group);
            let asks: Vec<ReleaseAsk> = first.iter().map(|w| w.ask.clone()).collect();
            match self.store.release_leases(&asks).await {
                Ok(answers) => {
                    for (waiter, answer) in first.into_iter().zip(answers) {
                        let _ = waiter.reply.send(Ok(answer));
                    }
                    for waiter in repeats {
                        let _ = waiter.reply.send(Ok(LeaseRelease::NotHeld));
                    }
                }
                Err(error) => {
                    let replies = first.into_iter().chain(repeats).map(|w| w.reply);
                    fail_all(replies, &StoreError::from(error));
                }
            }
        }
    }
}

/// The group's first release of each lease, in arrival order, and the
/// repeats.
fn first_of_each_lease(group: Vec<Waiter>) -> (Vec<Waiter>, Vec<Waiter>) {
    let mut seen = HashSet::new();
    group
        .into_iter()
        .partition(|waiter| seen.insert(waiter.ask.lease_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseScope;

    fn waiter(lease_id: i64) -> Waiter {
        let (reply, _answer) = tokio::sync::oneshot::channel();
        Waiter {
            ask: ReleaseAsk {
                lease_id,
                held_seconds: None,
                scope: LeaseScope::default(),
            },
            reply,
        }
    }

    #[test]
    fn a_lease_asked_twice_in_a_group_is_released_once() {
        let group = vec![waiter(7), waiter(8), waiter(7), waiter(9), waiter(8)];
        let (first, repeats) = first_of_each_lease(group);
        let ids = |w: &[Waiter]| w.iter().map(|w| w.ask.lease_id).collect::<Vec<_>>();
        assert_eq!(ids(&first), [7, 8, 9]);
        assert_eq!(ids(&repeats), [7, 8]);
    }
}
