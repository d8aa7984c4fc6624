//! The registry's plain operations, within the decision's time budget: the
//! registry lives in the store, so a store out of reach is a 503 here.

use super::shell::{Operation, StoreError};
use super::Arbiter;
use crate::store::work::Finish;
use crate::store::{NewWork, WorkItem};

impl Arbiter {
    /// `(item, created)`; a ref seen before returns the existing item.
    pub async fn enqueue(&self, work: &NewWork) -> Result<(WorkItem, bool), StoreError> {
        self.shell
            .run(Operation::EnqueueWork, self.store.enqueue(work))
            .await
    }

    pub async fn work_item(&self, id: i64) -> Result<Option<WorkItem>, StoreError> {
        self.shell
            .run(Operation::GetWork, self.store.work_item(id))
            .await
    }

    /// Done or released; `None` when `worker` holds no claim on it.
    pub async fn finish_work(
        &self,
        id: i64,
        worker: &str,
        finish: Finish,
    ) -> Result<Option<WorkItem>, StoreError> {
        let finished = self.store.finish_work(id, worker, finish);
        let Some((item, place_lease)) = self.shell.run(Operation::FinishWork, finished).await?
        else {
            return Ok(None);
        };
        if let Some(lease_id) = place_lease {
            // The emission is over: its in-flight place is free again (and
            // the hold time feeds the flow's average, as a report would).
            let released = self.store.release_lease(lease_id, None);
            self.shell.run(Operation::ReleaseLease, released).await?;
        }
        Ok(Some(item))
    }
}
