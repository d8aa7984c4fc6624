//! Reservations beyond the plain hourly budget: cadence tokens in the same
//! statement as the budget slots, and a concurrency lease taken in the same
//! transaction, so a grant gets all of them or none.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::{Reservation, Store};
use crate::catalog::QuotaRule;
use crate::clock::ClockReading;
use crate::decision::Limit;

/// What a decision asks of the store.
#[derive(Clone, Copy, Debug)]
pub struct SlotSpec<'a> {
    pub quota: &'a QuotaRule,
    pub flow: &'a str,
    pub slots: i64,
    /// The ceiling this flow may reach (headroom applied).
    pub ceiling: i64,
    /// Observe mode: spend regardless, report what would have refused.
    pub spend_regardless: bool,
}

/// What refused the reservation (or, in observe mode, would have), and when
/// it could succeed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refusal {
    pub limit: Limit,
    pub retry_at: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lease {
    pub id: i64,
    pub valid_until: DateTime<Utc>,
}

impl Store {
    /// Reserves budget slots, cadence tokens and (enforced quotas with
    /// `max_in_flight`) a concurrency lease: all of them or none.
    pub async fn reserve(&self, spec: &SlotSpec<'_>) -> Result<Reservation, sqlx::Error> {
        if spec.spend_regardless || spec.quota.max_in_flight.is_none() {
            return reserve_once(self.pool(), spec).await;
        }
        let mut tx = self.pool().begin().await?;
        let lease = sqlx::query_file!("sql/lease_place.sql", spec.quota.name, spec.flow)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(lease) = lease else {
            tx.rollback().await?;
            let (clock, retry_at) = first_lease_expiry(self.pool(), &spec.quota.name).await?;
            return Ok(Reservation {
                clock,
                count_after: None,
                refusal: Some(Refusal {
                    limit: Limit::InFlight,
                    retry_at,
                }),
                lease: None,
            });
        };
        let mut reservation = reserve_once(&mut *tx, spec).await?;
        if reservation.count_after.is_some() {
            tx.commit().await?;
            reservation.lease = Some(Lease {
                id: lease.lease_id,
                valid_until: lease.valid_until,
            });
        } else {
            // Gives the slot back: a refused reservation holds nothing.
            tx.rollback().await?;
        }
        Ok(reservation)
    }

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

    /// Multiplies an adaptive quota's cadence factor; `None` when the quota
    /// has no cadence or is not adaptive.
    pub async fn adapt_cadence(
        &self,
        quota: &str,
        multiplier: f64,
    ) -> Result<Option<AdaptedCadence>, sqlx::Error> {
        let row = sqlx::query_file!("sql/adapt_cadence.sql", quota, multiplier)
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

/// One statement: the plain conditional upsert, or budget and cadence together.
async fn reserve_once<'e>(
    executor: impl PgExecutor<'e>,
    spec: &SlotSpec<'_>,
) -> Result<Reservation, sqlx::Error> {
    let (quota, k, ceiling, regardless) = (
        &spec.quota.name,
        spec.slots,
        spec.ceiling,
        spec.spend_regardless,
    );
    let Some(cadence) = spec.quota.cadence else {
        let row = sqlx::query_file!("sql/reserve_slots.sql", quota, k, ceiling, regardless)
            .fetch_one(executor)
            .await?;
        let clock = clock_reading!(row);
        let over_budget = row.count_after.is_none_or(|after| after > ceiling);
        return Ok(Reservation {
            clock,
            count_after: row.count_after,
            refusal: over_budget.then_some(Refusal {
                limit: Limit::Budget,
                retry_at: clock.window_end,
            }),
            lease: None,
        });
    };
    let row = sqlx::query_file!(
        "sql/reserve_with_cadence.sql",
        quota,
        k,
        ceiling,
        regardless,
        cadence.rate,
        cadence.burst,
        cadence.adaptive
    )
    .fetch_one(executor)
    .await?;
    let clock = clock_reading!(row);
    // A full window outranks missing tokens: the tokens come back sooner.
    let budget_short = match row.count_after {
        Some(after) => after > ceiling,
        None => row.window_count.unwrap_or(0) + k > ceiling,
    };
    let refusal = if budget_short {
        Some(Refusal {
            limit: Limit::Budget,
            retry_at: clock.window_end,
        })
    } else if row.tokens_sufficed == Some(false)
        || (row.count_after.is_none() && row.tokens_sufficed.is_none())
    {
        Some(Refusal {
            limit: Limit::Cadence,
            retry_at: row.tokens_at.unwrap_or(clock.db_now),
        })
    } else {
        None
    };
    Ok(Reservation {
        clock,
        count_after: row.count_after,
        refusal,
        lease: None,
    })
}

/// Takes up to `k` single slots of a cadence quota in the caller's
/// transaction, each with its token, stopping at the first refusal.
pub async fn take_paced(
    tx: &mut sqlx::PgConnection,
    quota: &QuotaRule,
    k: i64,
    ceiling: i64,
) -> Result<super::Take, sqlx::Error> {
    let spec = SlotSpec {
        quota,
        flow: "",
        slots: 1,
        ceiling,
        spend_regardless: false,
    };
    let (mut taken, mut count_after) = (0, None);
    loop {
        let reservation = reserve_once(&mut *tx, &spec).await?;
        if reservation.count_after.is_some() {
            taken += 1;
            count_after = reservation.count_after;
        }
        if reservation.count_after.is_none() || taken == k {
            return Ok(super::Take {
                clock: reservation.clock,
                taken,
                count_after,
                stopped_by: reservation.refusal,
            });
        }
    }
}

/// When the first lease of `quota` expires: the earliest a full set of in-flight places can
/// have room again (a report may free one sooner).
pub async fn first_lease_expiry<'e>(
    db: impl sqlx::PgExecutor<'e>,
    quota: &str,
) -> Result<(ClockReading, DateTime<Utc>), sqlx::Error> {
    let row = sqlx::query_file!("sql/place_retry_at.sql", quota)
        .fetch_one(db)
        .await?;
    let clock = clock_reading!(row);
    Ok((clock, row.retry_at.unwrap_or(row.db_now)))
}
