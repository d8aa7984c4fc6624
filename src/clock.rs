//! The replica's estimate of the database clock, for the paths that must answer
//! without the store (deadline bypass). Every reading comes from PostgreSQL
//! (`arbiter_now()`, `window_start_of()`); between readings the estimate only
//! adds the replica's monotonic elapsed time. No window boundary is computed
//! here: the estimate only says whether the reported window is still current.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::domain::ClockReading;

#[derive(Clone, Default)]
pub struct DbClock {
    last: Arc<RwLock<Option<(ClockReading, Instant)>>>,
}

impl DbClock {
    pub fn note(&self, reading: ClockReading) {
        *self.last.write().unwrap_or_else(|p| p.into_inner()) = Some((reading, Instant::now()));
    }

    /// Estimated database time, or `None` before the first reading.
    pub fn now(&self) -> Option<DateTime<Utc>> {
        let (reading, at) = (*self.last.read().unwrap_or_else(|p| p.into_inner()))?;
        let elapsed = chrono::Duration::from_std(at.elapsed()).ok()?;
        Some(reading.db_now + elapsed)
    }

    /// When slots spent now are counted at (design.md §12: in every window
    /// of their quota that instant falls in): the estimated database time,
    /// to the second, while the last reported hour has not ended; `None`
    /// once it has (the flush then counts them at the database's now).
    pub fn spent_at(&self) -> Option<DateTime<Utc>> {
        use chrono::SubsecRound;
        self.window_start()?;
        self.now().map(|now| now.trunc_subsecs(0))
    }

    /// The window the database clock is estimated to be in, while the last
    /// reported window has not ended; `None` once it has (until the next reading).
    pub fn window_start(&self) -> Option<DateTime<Utc>> {
        let (reading, _) = (*self.last.read().unwrap_or_else(|p| p.into_inner()))?;
        (self.now()? < reading.window_end).then_some(reading.window_start)
    }
}
