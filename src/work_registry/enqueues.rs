//! The registry's plain operations, within the decision's time budget: the
//! registry lives in the store, so a store out of reach is a 503 here.

use super::WorkRegistry;
use crate::shell::gather::{fail_all, Gather, Reply};
use crate::shell::gather::{in_rounds, Batched};
use crate::shell::Operation;
use crate::store::work::{Finish, FinishAsk};
use crate::store::StoreError;
use crate::store::{NewWork, WorkItem};

pub(crate) struct EnqueueWaiter {
    work: NewWork,
    reply: Reply<(WorkItem, bool)>,
}

/// One queue: items of any flow go into one insert.
pub(crate) type Enqueues = Gather<(), (), EnqueueWaiter>;

impl WorkRegistry {
    /// `(item, created)`; a ref seen before returns the existing item.
    /// Concurrent enqueues share one statement (`gather.rs`): while one
    /// group's insert runs, the items that arrive queue for the next. An item
    /// whose caller stopped waiting is enqueued all the same, as a committed
    /// insert whose answer was lost would be; asked again with its ref, it is
    /// found.
    pub(crate) async fn enqueue(&self, work: NewWork) -> Result<(WorkItem, bool), StoreError> {
        let waiter = |reply| EnqueueWaiter { work, reply };
        let lead = |()| self.clone().lead_enqueues();
        let answer = self.enqueues.ask((), (), waiter, lead);
        self.shell.wait(Operation::EnqueueWork, answer).await
    }

    /// Inserts the queue's items, group after group, until nobody waits.
    #[tracing::instrument(skip_all)]
    async fn lead_enqueues(self) {
        while let Some(((), group)) = self.enqueues.next_group(&()) {
            let (works, replies): (Vec<NewWork>, Vec<_>) =
                group.into_iter().map(|w| (w.work, w.reply)).unzip();
            let inserted = self.store.enqueue(&works);
            match self.shell.run(Operation::EnqueueWork, inserted).await {
                Ok(items) => {
                    for (reply, item) in replies.into_iter().zip(items) {
                        let _ = reply.send(Ok(item));
                    }
                }
                // A statement that failed (not an outage) may have failed for
                // one item: each is tried alone, so it fails only itself.
                Err(StoreError::Failed(_)) if works.len() > 1 => {
                    for (reply, work) in replies.into_iter().zip(works) {
                        let alone = self.store.enqueue(std::slice::from_ref(&work));
                        let answer = self.shell.run(Operation::EnqueueWork, alone).await;
                        let _ = reply.send(answer.map(|mut items| items.remove(0)));
                    }
                }
                Err(error) => fail_all(replies, &error),
            }
        }
    }

    pub(crate) async fn work_item(&self, id: i64) -> Result<Option<WorkItem>, StoreError> {
        self.shell
            .run(Operation::GetWork, self.store.work_item(id))
            .await
    }

    /// Done or released; `None` when `worker` holds no claim on it.
    /// Concurrent finishes share one statement per group (each item once
    /// in a statement: a second finish of an item in the group runs after
    /// the first, as it would alone).
    pub(crate) async fn finish_work(
        &self,
        id: i64,
        worker: &str,
        finish: Finish,
    ) -> Result<Option<WorkItem>, StoreError> {
        let ask = FinishAsk {
            id,
            worker: worker.to_string(),
            finish,
        };
        let store = self.store.clone();
        let group = move |asks: Vec<FinishAsk>| finish_group(store.clone(), asks);
        let finished = self.finishes.ask(ask, group);
        let Some((item, place_lease)) = self.shell.run(Operation::FinishWork, finished).await?
        else {
            return Ok(None);
        };
        if let Some(lease_id) = place_lease {
            // The emission is over: its in-flight place is free again (and
            // the hold time feeds the flow's average, as a report would).
            let any_holder = crate::store::LeaseScope::default();
            self.reservations
                .release_lease(lease_id, None, &any_holder)
                .await?;
        }
        Ok(Some(item))
    }
}

/// One queue of finishes, whatever the flow.
pub(crate) type Finishes = Batched<FinishAsk, Option<(WorkItem, Option<i64>)>>;

/// Finishes a group: a statement per round of distinct items (the first
/// finish of each item, then the second, …), so that a repeat runs after
/// the finish it follows, as it would alone.
async fn finish_group(
    store: crate::store::Store,
    asks: Vec<FinishAsk>,
) -> Result<Vec<Option<(WorkItem, Option<i64>)>>, StoreError> {
    in_rounds(
        &asks,
        |ask| ask.id,
        |round| {
            let store = store.clone();
            async move { Ok(store.finish_works(&round).await?) }
        },
    )
    .await
}
