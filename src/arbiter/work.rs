//! The registry's plain operations, within the decision's time budget: the
//! registry lives in the store, so a store out of reach is a 503 here.

use super::{Arbiter, StoreUnavailable};
use crate::store::work::Finish;
use crate::store::{NewWork, WorkItem};

impl Arbiter {
    /// `(item, created)`; a ref seen before returns the existing item.
    pub async fn enqueue(&self, work: &NewWork) -> Result<(WorkItem, bool), StoreUnavailable> {
        self.bounded(self.store.enqueue(work), "enqueue_work").await
    }

    pub async fn work_item(&self, id: i64) -> Result<Option<WorkItem>, StoreUnavailable> {
        self.bounded(self.store.work_item(id), "get_work").await
    }

    /// Done or released; `None` when `worker` holds no claim on it.
    pub async fn finish_work(
        &self,
        id: i64,
        worker: &str,
        finish: Finish,
    ) -> Result<Option<WorkItem>, StoreUnavailable> {
        let finished = self.store.finish_work(id, worker, finish);
        let Some((item, place_lease)) = self.bounded(finished, "finish_work").await? else {
            return Ok(None);
        };
        if let Some(lease_id) = place_lease {
            // The emission is over: its in-flight place is free again (and
            // the hold time feeds the flow's average, as a report would).
            self.bounded(self.store.release_lease(lease_id, None), "release_lease")
                .await?;
        }
        Ok(Some(item))
    }
}
