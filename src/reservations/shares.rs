//! A worker client's share of the quotas its flows spend (design.md §10):
//! its presence, renewed while it follows the shares, counts it among the
//! quota's live clients, and the shares it reads divide each quota by them.

use super::Reservations;
use crate::domain::FlowName;
use crate::shell::Operation;
use crate::store::{QuotaShare, Store, StoreError};

/// One connected client's presence.
pub struct SharePresence {
    store: Store,
    shell: crate::shell::Shell,
    flows: Vec<String>,
    id: Option<i64>,
}

impl Reservations {
    /// A presence for a client of `flows`, not yet announced.
    pub(crate) fn share_presence(&self, flows: Vec<FlowName>) -> SharePresence {
        SharePresence {
            store: self.store.clone(),
            shell: self.shell.clone(),
            flows: flows.into_iter().map(FlowName::into_string).collect(),
            id: None,
        }
    }
}

impl SharePresence {
    /// Announces the presence (or renews it) and reads the shares.
    pub async fn beat(&mut self) -> Result<Vec<QuotaShare>, StoreError> {
        let (store, flows, id) = (&self.store, &self.flows, &mut self.id);
        let beat = async {
            match *id {
                Some(id) => store.beat_stream(id, flows).await?,
                None => *id = Some(store.join_stream(flows).await?),
            }
            store.stream_shares(flows).await
        };
        self.shell.run(Operation::ShareStream, beat).await
    }

    /// Gone now, not after the 3 s a missing heartbeat takes.
    pub(crate) async fn leave(self) {
        if let Some(id) = self.id {
            let left = self.store.leave_stream(id);
            let _ = self.shell.run(Operation::ShareStream, left).await;
        }
    }
}
