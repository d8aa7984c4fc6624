//! The replica's copy of the catalog (`crate::domain::catalog::Snapshot`),
//! reloaded from the database. Decisions read the copy so that observe, count
//! and unknown flows keep answering when the store is out of reach.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::catalog::Snapshot;
use crate::mirror::Mirror;
use crate::store::{Store, StoreError, StoreUnavailable};

/// The replica's view of the catalog. `None` until the first successful load:
/// until then nobody can tell an enforced flow from an unknown one, so
/// decisions that would need the store fail closed. Older than `stale_after`
/// (its reloads keep failing: the store out of reach, a sync that hangs), it
/// may be obeying flags changed since: enforced decisions fail closed, and
/// the replica is not ready (docs/design.md §13).
#[derive(Clone)]
pub struct Catalog {
    current: Mirror<Option<Arc<Snapshot>>>,
    stale_after: Duration,
}

/// How old a catalog may be before a replica stops trusting it by default:
/// five periodic syncs missed.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(10);

impl Default for Catalog {
    fn default() -> Self {
        Self::new(DEFAULT_STALE_AFTER)
    }
}

impl Catalog {
    pub(crate) fn new(stale_after: Duration) -> Self {
        Self {
            current: Mirror::default(),
            stale_after,
        }
    }

    /// Loaded, but not reloaded for longer than the bound.
    pub(crate) fn is_stale(&self) -> bool {
        self.current.age().is_some_and(|age| age > self.stale_after)
    }

    /// Whether a copy loaded `age` ago (the key ring's) is within the bound.
    pub(crate) fn within_bound(&self, age: Option<Duration>) -> bool {
        age.is_some_and(|age| age <= self.stale_after)
    }

    /// How long ago the catalog was loaded; `None` before the first load.
    pub(crate) fn age(&self) -> Option<Duration> {
        self.current.age()
    }

    pub(crate) fn stale_after(&self) -> Duration {
        self.stale_after
    }

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

/// A catalog not reloaded within its bound may be obeying a flag changed
/// since: an enforced decision fails closed, as when the store is out of
/// reach (a 503).
pub(crate) fn stale() -> StoreError {
    StoreUnavailable("catalog not reloaded within its bound".into()).into()
}
