//! The replica's copy of the catalog (`crate::domain::catalog::Snapshot`),
//! reloaded from the database. Decisions read the copy so that observe, count
//! and unknown flows keep answering when the store is out of reach.

use std::sync::Arc;

use crate::domain::catalog::Snapshot;
use crate::mirror::Mirror;
use crate::store::Store;

/// The replica's view of the catalog. `None` until the first successful load:
/// until then nobody can tell an enforced flow from an unknown one, so
/// decisions that would need the store fail closed.
#[derive(Clone, Default)]
pub struct Catalog {
    current: Mirror<Option<Arc<Snapshot>>>,
}

impl Catalog {
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.current.read(Option::clone)
    }

    pub fn is_loaded(&self) -> bool {
        self.snapshot().is_some()
    }

    /// Reloads the snapshot, in turn with every other reload (`Mirror`).
    pub async fn refresh(&self, store: &Store) -> Result<(), sqlx::Error> {
        let load = async { Ok(Some(Arc::new(store.load_catalog().await?))) };
        self.current.reload(load).await
    }
}
