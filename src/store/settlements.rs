//! Estimates settled to the actual (design.md §12): a reservation made to be
//! settled is recorded with the windows it was taken from, a row per quota
//! it spent; its settlement gives back what was over-estimated to those
//! still open, or takes what was under-estimated without a ceiling, once.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Store;

/// A reservation to settle, as recorded when it was granted.
#[derive(Clone, Debug)]
pub struct OpenReservation {
    pub flow: String,
    /// Each quota it spent, the flow's own first.
    pub quotas: Vec<ReservedQuota>,
    /// The API key that reserved (`None`: no keys, or the admin token).
    pub key_id: Option<i64>,
}

/// What a reservation took of one quota.
#[derive(Clone, Debug)]
pub struct ReservedQuota {
    pub quota: String,
    /// The slots taken, as estimated.
    pub estimated: i64,
    /// The windows they were taken from: period, start, end.
    pub windows: Vec<(String, DateTime<Utc>, DateTime<Utc>)>,
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
        /// What was spent of each quota, in the reservation's order.
        spent: Vec<i64>,
        windows: Vec<SettledWindow>,
    },
}

/// A window a settlement changed, and its count after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledWindow {
    pub quota: String,
    pub period: String,
    pub count: i64,
}

/// The windows of every quota of a reservation, end to end: window j is of
/// quota `quota[j]`.
struct WindowColumns {
    quota: Vec<String>,
    period: Vec<String>,
    start: Vec<DateTime<Utc>>,
    end: Vec<DateTime<Utc>>,
}

impl WindowColumns {
    fn of(quotas: &[ReservedQuota]) -> Self {
        let windows = quotas
            .iter()
            .flat_map(|q| q.windows.iter().map(move |w| (&q.quota, w)));
        let mut columns = WindowColumns {
            quota: Vec::new(),
            period: Vec::new(),
            start: Vec::new(),
            end: Vec::new(),
        };
        for (quota, (period, start, end)) in windows {
            columns.quota.push(quota.clone());
            columns.period.push(period.clone());
            columns.start.push(*start);
            columns.end.push(*end);
        }
        columns
    }
}

impl Store {
    /// Records a granted reservation to be settled; answers its id.
    pub(crate) async fn open_reservation(
        &self,
        reservation: &OpenReservation,
    ) -> Result<i64, sqlx::Error> {
        let quotas: Vec<String> = reservation.quotas.iter().map(|q| q.quota.clone()).collect();
        let estimated: Vec<i64> = reservation.quotas.iter().map(|q| q.estimated).collect();
        let windows = WindowColumns::of(&reservation.quotas);
        let ids = sqlx::query_file_scalar!(
            "sql/reservation_open.sql",
            &quotas,
            reservation.flow,
            &estimated,
            &windows.quota,
            &windows.period,
            &windows.start,
            &windows.end,
            reservation.key_id
        )
        .fetch_all(self.pool())
        .await?;
        ids.first().copied().ok_or(sqlx::Error::RowNotFound)
    }

    /// Settles reservation `id` at what `spent` answers of each of its
    /// quotas as locked (or not, if it refuses): one transaction, the
    /// reservation's rows locked first, then the windows they were taken
    /// from that are still open.
    pub(crate) async fn settle_reservation<E>(
        &self,
        id: i64,
        spent: impl FnOnce(&LockedReservation) -> Result<Vec<i64>, E>,
        settle_within: Duration,
    ) -> Result<Settlement<E>, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let rows = sqlx::query_file!("sql/reservation_lock.sql", id, settle_within.as_secs_f64())
            .fetch_all(&mut tx)
            .await?;
        let Some(first) = rows.first() else {
            return Ok(Settlement::NotFound);
        };
        let (flow, key_id) = (first.flow.clone(), first.key_id);
        let settled = rows.iter().any(|row| row.settled_at.is_some());
        let expired = first.expired;
        let quotas = rows
            .into_iter()
            .map(|row| ReservedQuota {
                quota: row.quota,
                estimated: row.estimated,
                windows: row
                    .periods
                    .into_iter()
                    .zip(row.window_starts)
                    .zip(row.window_ends)
                    .map(|((period, start), end)| (period, start, end))
                    .collect(),
            })
            .collect();
        let locked = LockedReservation {
            reservation: OpenReservation {
                flow,
                quotas,
                key_id,
            },
            settled,
            expired,
        };
        let actual = match spent(&locked) {
            Ok(actual) => actual,
            Err(refused) => return Ok(Settlement::Refused(refused)),
        };
        let r = &locked.reservation;
        let names: Vec<String> = r.quotas.iter().map(|q| q.quota.clone()).collect();
        let more: Vec<i64> = r
            .quotas
            .iter()
            .zip(&actual)
            .map(|(q, spent)| spent - q.estimated)
            .collect();
        let windows = WindowColumns::of(&r.quotas);
        let adjusted = sqlx::query_file!(
            "sql/reservation_settle.sql",
            id,
            r.flow,
            &names,
            &actual,
            &more,
            &windows.quota,
            &windows.period,
            &windows.start,
            &windows.end
        )
        .fetch_one(&mut tx)
        .await?;
        tx.commit().await?;
        let windows = adjusted
            .quotas
            .into_iter()
            .zip(adjusted.periods)
            .zip(adjusted.counts)
            .map(|((quota, period), count)| SettledWindow {
                quota,
                period,
                count,
            })
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
