//! In-flight places and what follows a grant: the lease a grant holds on a
//! place, what deferred a reservation (a [`Deferral`]: its limit and when it
//! could succeed), a lease freed, and the adaptive cadence fed by upstream
//! statuses. Taking slots, tokens and places together is `paced.rs`.

use chrono::{DateTime, Utc};

use super::Store;
use crate::domain::decision::Limit;
use crate::domain::ClockReading;

/// What refused the reservation (or, in observe mode, would have), and when
/// it could succeed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deferral {
    pub limit: Limit,
    pub retry_at: DateTime<Utc>,
}

impl Deferral {
    /// The window (as `clock` read it) has too little left: more comes when
    /// it ends.
    pub fn budget(clock: &ClockReading) -> Self {
        Deferral {
            limit: Limit::Budget,
            retry_at: clock.window_end,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lease {
    pub id: i64,
    pub valid_until: DateTime<Utc>,
}

impl Store {
    /// Frees a lease's place and feeds its hold time into the flow's average.
    /// `None` when the lease is unknown or already expired and taken again.
    /// `held_seconds`: how long the emission took, as the worker measured it;
    /// `None`: the time since the lease was taken.
    pub async fn release_lease(
        &self,
        lease_id: i64,
        held_seconds: Option<f64>,
    ) -> Result<Option<ReleasedLease>, sqlx::Error> {
        let any_holder = LeaseHolder::default();
        Ok(
            match self
                .release_held_lease(lease_id, held_seconds, &any_holder)
                .await?
            {
                LeaseRelease::Released(released) => Some(released),
                LeaseRelease::NotHeld | LeaseRelease::HeldByOther(_) => None,
            },
        )
    }

    /// [`release_lease`](Self::release_lease) on behalf of a caller that says
    /// whose lease it is: one held by another flow or quota stays held.
    pub async fn release_held_lease(
        &self,
        lease_id: i64,
        held_seconds: Option<f64>,
        holder: &LeaseHolder,
    ) -> Result<LeaseRelease, sqlx::Error> {
        let row = sqlx::query_file!(
            "sql/release_lease.sql",
            lease_id,
            held_seconds,
            holder.flow.as_deref(),
            holder.quota.as_deref()
        )
        .fetch_one(self.pool())
        .await?;
        Ok(match (row.flow, row.holder_flow, row.holder_quota) {
            (Some(flow), _, _) => LeaseRelease::Released(ReleasedLease {
                flow,
                held_seconds: row.held_seconds.unwrap_or_default(),
                avg_seconds: row.avg_seconds.unwrap_or_default(),
            }),
            (None, Some(flow), Some(quota)) => LeaseRelease::HeldByOther(LeaseHolder {
                flow: Some(flow),
                quota: Some(quota),
            }),
            (None, _, _) => LeaseRelease::NotHeld,
        })
    }

    /// Adapts a quota's cadence factor to an upstream's `status`; `None`
    /// when the quota has no cadence or is not adaptive, or the status says
    /// nothing about the rate.
    pub async fn adapt_cadence(
        &self,
        quota: &str,
        status: u16,
    ) -> Result<Option<AdaptedCadence>, sqlx::Error> {
        let row = sqlx::query_file!("sql/adapt_cadence.sql", quota, i32::from(status))
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(|r| AdaptedCadence {
            factor: r.factor,
            effective_rate: r.effective_rate,
            effective_burst: r.effective_burst,
        }))
    }
}

/// Who a lease belongs to; a field left `None` matches any.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaseHolder {
    pub flow: Option<String>,
    pub quota: Option<String>,
}

#[derive(Clone, Debug)]
pub enum LeaseRelease {
    Released(ReleasedLease),
    /// Unknown, or expired and taken again: nothing to free.
    NotHeld,
    /// Held by another flow or quota than the caller said: left alone.
    HeldByOther(LeaseHolder),
}

#[derive(Clone, Debug)]
pub struct ReleasedLease {
    pub flow: String,
    pub held_seconds: f64,
    pub avg_seconds: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct AdaptedCadence {
    pub factor: f64,
    pub effective_rate: f64,
    pub effective_burst: f64,
}

/// When the first lease of `quota` expires: the earliest a full set of in-flight places can
/// have room again (a report may free one sooner).
pub(super) async fn first_lease_expiry<'e>(
    db: impl sqlx::PgExecutor<'e>,
    quota: &str,
) -> Result<(ClockReading, DateTime<Utc>), sqlx::Error> {
    let row = sqlx::query_file!("sql/place_retry_at.sql", quota)
        .fetch_one(db)
        .await?;
    let clock = clock_reading!(row);
    Ok((clock, row.retry_at.unwrap_or(row.db_now)))
}
