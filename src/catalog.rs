//! The replica's copy of the catalog (`crate::domain::catalog::Snapshot`),
//! reloaded from the database. Decisions read the copy so that observe, count
//! and unknown flows keep answering when the store is out of reach.

use std::sync::Arc;

use crate::domain::catalog::Snapshot;
use crate::mirror::Mirror;
use crate::store::{Store, StoreError, StoreUnavailable};

/// The replica's view of the catalog. `None` until the first successful load:
/// until then nobody can tell an enforced flow from an unknown one, so
/// decisions that would need the store fail closed.
#[derive(Clone, Default)]
pub struct Catalog {
    current: Mirror<Option<Arc<Snapshot>>>,
}

impl Catalog {
    pub(crate) fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.current.read(Option::clone)
    }

    /// The snapshot, for a decision that needs it: before the first load
    /// nobody can tell an enforced flow from an unknown one, so it fails
    /// closed ([`not_loaded`]).
    pub fn loaded(&self) -> Result<Arc<Snapshot>, StoreError> {
        self.snapshot().ok_or_else(not_loaded)
    }

    pub(crate) fn is_loaded(&self) -> bool {
        self.snapshot().is_some()
    }

    /// Reloads the snapshot, in turn with every other reload (`Mirror`).
    pub(crate) async fn refresh(&self, store: &Store) -> Result<(), sqlx::Error> {
        let load = async { Ok(Some(Arc::new(store.load_catalog().await?))) };
        self.current.reload(load).await
    }
}

/// Before the first catalog load nobody can tell an enforced flow from an
/// unknown one: the decision paths fail closed, as when the store is out of
/// reach (a 503 for an enforced decision).
pub(crate) fn not_loaded() -> StoreError {
    StoreUnavailable("catalog not loaded yet".into()).into()
}
