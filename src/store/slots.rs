//! Taking up to k slots in one statement, and giving back what no item used.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::{Refusal, Store};
use crate::clock::ClockReading;
use crate::decision::Limit;

/// What the take-up-to-k upsert answered.
#[derive(Clone, Copy, Debug)]
pub struct Take {
    pub clock: ClockReading,
    /// Slots taken: `least(k, ceiling - count)`, 0 when the window is full.
    pub taken: i64,
    /// The window's count after the take (`None` when nothing was taken).
    pub count_after: Option<i64>,
    /// Fewer than asked were taken: the limit that stopped the take, and
    /// when it lifts.
    pub stopped_by: Option<Refusal>,
}

impl Store {
    pub async fn take_slots(&self, quota: &str, k: i64, ceiling: i64) -> Result<Take, sqlx::Error> {
        take_slots(self.pool(), quota, k, ceiling).await
    }

    pub async fn give_back_slots(
        &self,
        quota: &str,
        window_start: DateTime<Utc>,
        slots: i64,
    ) -> Result<(), sqlx::Error> {
        give_back_slots(self.pool(), quota, window_start, slots).await
    }
}

/// One conditional upsert (design.md §3.2, §8): takes `least(k, what is left)`
/// of `quota`'s current window. The caller guards `ceiling < 1`.
pub async fn take_slots<'e>(
    db: impl PgExecutor<'e>,
    quota: &str,
    k: i64,
    ceiling: i64,
) -> Result<Take, sqlx::Error> {
    let row = sqlx::query_file!("sql/take_slots.sql", quota, k, ceiling)
        .fetch_one(db)
        .await?;
    let clock = clock_reading!(row);
    Ok(Take {
        clock,
        taken: row.taken,
        count_after: row.count_after,
        stopped_by: (row.taken < k).then_some(Refusal {
            limit: Limit::Budget,
            retry_at: clock.window_end,
        }),
    })
}

/// Decrements the window the slots were taken from (never another one).
pub async fn give_back_slots<'e>(
    db: impl PgExecutor<'e>,
    quota: &str,
    window_start: DateTime<Utc>,
    slots: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query_file!("sql/give_back_slots.sql", quota, window_start, slots)
        .execute(db)
        .await?;
    Ok(())
}
