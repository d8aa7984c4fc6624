//! Estimates settled to the actual (design.md §12): a reservation made to be
//! settled is recorded with the windows it was taken from; its settlement
//! gives back what was over-estimated to those still open, or takes what
//! was under-estimated without a ceiling, once.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Store;

/// A reservation to settle, as recorded when it was granted.
#[derive(Clone, Debug)]
pub struct OpenReservation {
    pub quota: String,
    pub flow: String,
    /// The slots taken, as estimated.
    pub estimated: i64,
    /// The windows they were taken from: period, start, end.
    pub windows: Vec<(String, DateTime<Utc>, DateTime<Utc>)>,
    /// The API key that reserved (`None`: no keys, or the admin token).
    pub key_id: Option<i64>,
}

/// A recorded reservation as a settlement finds it, locked.
#[derive(Clone, Debug)]
pub struct LockedReservation {
    pub reservation: OpenReservation,
    pub settled: bool,
    /// Its time to settle is past: it stays spent as estimated.
    pub expired: bool,
}

/// What a settlement came to.
#[derive(Debug)]
pub(crate) enum Settlement<E> {
    /// No such reservation (or pruned).
    NotFound,
    /// The caller's rule refused it, as locked.
    Refused(E),
    Settled {
        reservation: OpenReservation,
        spent: i64,
        windows: Vec<SettledWindow>,
    },
}

/// A window a settlement changed, and its count after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledWindow {
    pub period: String,
    pub count: i64,
}

impl Store {
    /// Records a granted reservation to be settled; answers its id.
    pub(crate) async fn open_reservation(
        &self,
        reservation: &OpenReservation,
    ) -> Result<i64, sqlx::Error> {
        let periods: Vec<String> = reservation.windows.iter().map(|w| w.0.clone()).collect();
        let starts: Vec<DateTime<Utc>> = reservation.windows.iter().map(|w| w.1).collect();
        let ends: Vec<DateTime<Utc>> = reservation.windows.iter().map(|w| w.2).collect();
        sqlx::query_file_scalar!(
            "sql/reservation_open.sql",
            reservation.quota,
            reservation.flow,
            reservation.estimated,
            &periods,
            &starts,
            &ends,
            reservation.key_id
        )
        .fetch_one(self.pool())
        .await
    }

    /// Settles reservation `id` at what `spent` answers of it as locked (or
    /// not, if it refuses): one transaction, the reservation row locked
    /// first, then the windows it was taken from that are still open.
    pub(crate) async fn settle_reservation<E>(
        &self,
        id: i64,
        spent: impl FnOnce(&LockedReservation) -> Result<i64, E>,
        settle_within: Duration,
    ) -> Result<Settlement<E>, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query_file!("sql/reservation_lock.sql", id, settle_within.as_secs_f64())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(Settlement::NotFound);
        };
        let locked = LockedReservation {
            reservation: OpenReservation {
                quota: row.quota,
                flow: row.flow,
                estimated: row.estimated,
                windows: row
                    .periods
                    .into_iter()
                    .zip(row.window_starts)
                    .zip(row.window_ends)
                    .map(|((period, start), end)| (period, start, end))
                    .collect(),
                key_id: row.key_id,
            },
            settled: row.settled_at.is_some(),
            expired: row.expired,
        };
        let actual = match spent(&locked) {
            Ok(actual) => actual,
            Err(refused) => return Ok(Settlement::Refused(refused)),
        };
        let r = &locked.reservation;
        let periods: Vec<String> = r.windows.iter().map(|w| w.0.clone()).collect();
        let starts: Vec<DateTime<Utc>> = r.windows.iter().map(|w| w.1).collect();
        let ends: Vec<DateTime<Utc>> = r.windows.iter().map(|w| w.2).collect();
        let adjusted = sqlx::query_file!(
            "sql/reservation_settle.sql",
            id,
            r.quota,
            r.flow,
            actual,
            actual - r.estimated,
            &periods,
            &starts,
            &ends
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let windows = adjusted
            .periods
            .into_iter()
            .zip(adjusted.counts)
            .map(|(period, count)| SettledWindow { period, count })
            .collect();
        Ok(Settlement::Settled {
            reservation: locked.reservation,
            spent: actual,
            windows,
        })
    }

    /// Reservations an hour past their time to settle, a batch at a time.
    pub async fn prune_reservations(
        &self,
        settle_within: Duration,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let pruned = sqlx::query_file!(
            "sql/reservation_prune.sql",
            settle_within.as_secs_f64(),
            batch
        )
        .execute(self.pool())
        .await?;
        Ok(pruned.rows_affected())
    }
}
