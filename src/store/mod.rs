//! PostgreSQL: the single atomic arbiter. Every statement lives in `sql/`.

/// The clock columns every time-dependent statement returns (`db_now`,
/// `window_start`, `window_end`), as a [`ClockReading`](crate::domain::ClockReading).
macro_rules! clock_reading {
    ($row:expr) => {
        crate::domain::ClockReading {
            db_now: $row.db_now,
            window_start: $row.window_start,
            window_end: $row.window_end,
        }
    };
}

mod admin;
mod admit;
mod bootstrap;
mod catalog;
pub mod claim;
mod connections;
mod history;
mod keys;
mod leases;
mod paced;
mod reach;
mod settlements;
mod several;
mod slots;
mod stream;
pub mod work;

pub use admin::{
    CatalogError, CountedWindow, FlowRow, ObserveTally, QuotaRow, SpentHour, UsageRow, WhenMissing,
    WindowRow,
};
pub use admit::RouteClassRow;
pub use bootstrap::{
    connect_lazy, connect_options, ensure_database, migrate, objects_fingerprint,
    recorded_fingerprint, seed_catalog, SqlObject, FRESH_MIGRATOR, FUNCTIONS, MIGRATOR,
    OBJECTS_REVISION, VIEWS,
};
pub use connections::{Connections, StoreTransaction};
pub use keys::{ActiveKey, KeyRow};
pub use leases::{AdaptedCadence, Lease, LeaseRelease, LeaseScope, ReleaseAsk, ReleasedLease};
pub use paced::{LabelledLease, PacedAsks, PacedGiveBack, PacedTake};
pub use reach::{unreachable, StoreError, StoreUnavailable, RETRY_AFTER_UNAVAILABLE};
pub(crate) use settlements::Settlement;
pub use settlements::{LockedReservation, OpenReservation, ReservedQuota, SettledWindow};
pub(crate) use several::SeveralAsk;
pub use slots::{QuotaAsk, QuotaTake, Take};
pub use stream::{QuotaShare, ShareWindow};
pub use work::{NewWork, WorkItem};

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::Semaphore;

use crate::domain::decision::Deferral;
use crate::domain::window::WindowCount;
use crate::domain::ClockReading;
use crate::domain::PoolMode;

/// The reservation store: the only code that can spend a slot conditionally.
#[derive(Clone, Debug)]
pub struct Store {
    pool: Connections,
    /// Claim transactions open at once: at most half the pool. A claim's
    /// transaction holds its connection while the claim's take, in a
    /// statement of its own, needs another; as many open transactions as
    /// connections left no take a connection, and every claim waited out its
    /// time limit (design.md §9).
    claim_transactions: Arc<Semaphore>,
}

/// What a take answered one reservation.
#[derive(Clone, Debug)]
pub(crate) struct Reservation {
    pub clock: ClockReading,
    /// The quota's windows as the take found them.
    pub windows: Vec<WindowCount>,
    /// What the take's group spent in every window up to this reservation,
    /// its own slots included; `None` when it was refused.
    pub spent: Option<i64>,
    /// What refused it; in observe mode, what would have.
    pub refusal: Option<Deferral>,
    /// The concurrency lease a grant holds (quotas with `max_in_flight`).
    pub lease: Option<Lease>,
    /// A call that spends several quotas (design.md §12): each further
    /// quota's windows as the take found them and what it spent there, in
    /// the flow's order.
    pub further: Vec<(Vec<WindowCount>, Option<i64>)>,
}

impl Reservation {
    /// Each quota's windows and what was spent there, the flow's own quota
    /// first: what the answer counts in.
    pub(crate) fn quotas(&self) -> Vec<(&[WindowCount], Option<i64>)> {
        std::iter::once((self.windows.as_slice(), self.spent))
            .chain(self.further.iter().map(|(w, s)| (w.as_slice(), *s)))
            .collect()
    }
}

impl Store {
    /// A store on connections straight to PostgreSQL (or a session pooler).
    pub fn new(pool: PgPool) -> Self {
        Self::with_mode(pool, PoolMode::Session)
    }

    /// A store on connections that reach PostgreSQL as `mode` says.
    pub fn with_mode(pool: PgPool, mode: PoolMode) -> Self {
        let pool = Connections::new(pool, mode);
        let claim_transactions = (pool.max_connections() / 2).max(1) as usize;
        Self {
            pool,
            claim_transactions: Arc::new(Semaphore::new(claim_transactions)),
        }
    }

    /// The connections every statement of the store runs on.
    pub fn pool(&self) -> &Connections {
        &self.pool
    }

    pub(crate) async fn read_clock(&self) -> Result<ClockReading, sqlx::Error> {
        let row = sqlx::query_file!("sql/db_clock.sql")
            .fetch_one(&self.pool)
            .await?;
        Ok(clock_reading!(row))
    }

    /// What the store can lose in a failover (`crate::durability`).
    pub(crate) async fn durability(&self) -> Result<crate::durability::Reading, sqlx::Error> {
        let row = sqlx::query_file!("sql/durability.sql")
            .fetch_one(&self.pool)
            .await?;
        Ok(crate::durability::Reading {
            synchronous_commit: row.synchronous_commit,
            synchronous_standby_names: row.synchronous_standby_names,
            standbys: row.standbys,
            synchronous_standbys: row.synchronous_standbys,
            timeline: row.timeline,
        })
    }

    /// Ready: the store answers and every migration of this build is applied
    /// (by version: a database that applied other migrations, e.g. those the
    /// baseline replaced, is not ready for this build).
    pub(crate) async fn is_ready(&self) -> bool {
        let versions: Vec<i64> = MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| m.version)
            .collect();
        match sqlx::query_file!("sql/readiness.sql", &versions)
            .fetch_one(&self.pool)
            .await
        {
            Ok(row) => row.applied == versions.len() as i64,
            Err(_) => false,
        }
    }
}
