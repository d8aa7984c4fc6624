//! In-flight places and what follows a grant: the lease a grant holds on a
//! place, when a full set of places frees one, a lease freed, and the
//! adaptive cadence fed by upstream statuses. Taking slots, tokens and places together is `paced.rs`.

use chrono::{DateTime, Utc};

use super::Store;
use crate::domain::decision::Outlook;

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
        let ask = ReleaseAsk {
            lease_id,
            held_seconds,
            scope: LeaseScope::default(),
        };
        let released = self.release_leases(std::slice::from_ref(&ask)).await?;
        Ok(match released.into_iter().next() {
            Some(LeaseRelease::Released(released)) => Some(released),
            _ => None,
        })
    }

    /// Frees the places of a group of releases in one statement
    /// (`sql/release_leases.sql`), each lease once, and folds each flow's
    /// hold times into its average in the order given; one answer per ask,
    /// in that order. A lease held by another flow or quota than its ask
    /// says stays held.
    pub async fn release_leases(
        &self,
        asks: &[ReleaseAsk],
    ) -> Result<Vec<LeaseRelease>, sqlx::Error> {
        let ids: Vec<i64> = asks.iter().map(|a| a.lease_id).collect();
        let held: Vec<Option<f64>> = asks.iter().map(|a| a.held_seconds).collect();
        let flows: Vec<Option<String>> = asks.iter().map(|a| a.scope.flow.clone()).collect();
        let quotas: Vec<Option<String>> = asks.iter().map(|a| a.scope.quota.clone()).collect();
        let rows = sqlx::query_file!(
            "sql/release_leases.sql",
            &ids,
            &held as &[Option<f64>],
            &flows as &[Option<String>],
            &quotas as &[Option<String>]
        )
        .fetch_all(self.pool())
        .await?;
        if rows.len() != asks.len() {
            return Err(sqlx::Error::RowNotFound);
        }
        Ok(rows
            .into_iter()
            .map(|row| match (row.flow, row.holder_flow, row.holder_quota) {
                (Some(flow), _, _) => LeaseRelease::Released(ReleasedLease {
                    flow,
                    held_seconds: row.held_seconds.unwrap_or_default(),
                    avg_seconds: row.avg_seconds.unwrap_or_default(),
                }),
                (None, Some(flow), Some(quota)) => LeaseRelease::HeldByOther(LeaseScope {
                    flow: Some(flow),
                    quota: Some(quota),
                }),
                (None, _, _) => LeaseRelease::NotHeld,
            })
            .collect())
    }

    /// Adapts each report's quota's cadence factor to its upstream's status
    /// (`reports`: quota and status), a group in one statement, each
    /// quota's reports folded in the order given; one answer per report,
    /// `None` where the quota has no adaptive cadence or the status says
    /// nothing of the rate.
    pub async fn adapt_cadences(
        &self,
        reports: &[(String, u16)],
    ) -> Result<Vec<Option<AdaptedCadence>>, sqlx::Error> {
        let quotas: Vec<String> = reports.iter().map(|(q, _)| q.clone()).collect();
        let statuses: Vec<i32> = reports.iter().map(|(_, s)| i32::from(*s)).collect();
        let rows = sqlx::query_file!("sql/adapt_cadence.sql", &quotas, &statuses)
            .fetch_all(self.pool())
            .await?;
        if rows.len() != reports.len() {
            return Err(sqlx::Error::RowNotFound);
        }
        Ok(rows
            .into_iter()
            .map(|r| {
                Some(AdaptedCadence {
                    factor: r.factor?,
                    effective_rate: r.effective_rate?,
                    effective_burst: r.effective_burst?,
                })
            })
            .collect())
    }
}

/// One release of a group: the lease, how long its emission took (`None`:
/// since the lease was taken), and whose the caller says it is.
#[derive(Clone, Debug, PartialEq)]
pub struct ReleaseAsk {
    pub lease_id: i64,
    pub held_seconds: Option<f64>,
    pub scope: LeaseScope,
}

/// The flow and quota a lease was granted to, as a release says them (not
/// the lease holder, the key that took it); a field left `None` matches any.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaseScope {
    pub flow: Option<String>,
    pub quota: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LeaseRelease {
    Released(ReleasedLease),
    /// Unknown, or expired and taken again: nothing to free.
    NotHeld,
    /// Held by another flow or quota than the caller said: left alone.
    HeldByOther(LeaseScope),
}

#[derive(Clone, Debug, PartialEq)]
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

/// What `quota`'s in-flight places say of when one frees: the first live
/// lease's expiry (a report may free one sooner), by the database clock.
pub(super) async fn places_outlook<'e>(
    db: impl sqlx::PgExecutor<'e>,
    quota: &str,
) -> Result<Outlook, sqlx::Error> {
    let row = sqlx::query_file!("sql/first_lease_expiry.sql", quota)
        .fetch_one(db)
        .await?;
    Ok(Outlook {
        clock: clock_reading!(row),
        bucket: None,
        first_lease_expiry: row.first_lease_expiry,
        typical_hold: row.typical_hold.and_then(super::paced::hold_duration),
        reopening: None,
    })
}
