//! Taking up to k slots in one statement, and giving back what no item used.

use chrono::{DateTime, Utc};

use super::Store;
use crate::domain::decision::Deferral;
use crate::domain::ClockReading;

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
    pub stopped_by: Option<Deferral>,
}

/// One quota's part of a take across quotas: what its group asked.
#[derive(Clone, Debug)]
pub struct QuotaAsk {
    pub quota: String,
    /// Slots asked for the quota's whole group.
    pub wanted: i64,
    /// The highest ceiling among the group's requests.
    pub ceiling: i64,
    /// The smallest request of the group: fewer slots left than this is nothing.
    pub smallest: i64,
}

/// One quota's part of a take across quotas: what its group got. No
/// refusal: the group's requests are rationed the take, and each refusal is
/// built from that.
#[derive(Clone, Copy, Debug)]
pub struct QuotaTake {
    pub clock: ClockReading,
    /// Slots taken, 0 when the window had too little left.
    pub taken: i64,
    /// The window's count after the take (`None` when nothing was taken).
    pub count_after: Option<i64>,
}

impl Take {
    /// One claim's part of a take its group shared (design.md §9): `share` of
    /// the slots, for a claim that wanted `wanted`. Only a claim that got
    /// less than it wanted hears what stopped the take: a claim served in
    /// full was held back by nothing, whatever its neighbours got.
    pub(crate) fn share_of(self, share: i64, wanted: i64) -> Take {
        Take {
            taken: share,
            stopped_by: if share < wanted {
                self.stopped_by
            } else {
                None
            },
            ..self
        }
    }
}

impl QuotaAsk {
    /// Observe mode: `slots` of `quota` spent whatever the window's count,
    /// so that the count stays the honest record of every slot spent.
    pub fn regardless(quota: &str, slots: i64) -> Self {
        QuotaAsk {
            quota: quota.to_string(),
            wanted: slots,
            ceiling: i64::MAX,
            smallest: slots,
        }
    }
}

impl Store {
    /// One statement takes slots of every quota in `asks` (each row its own
    /// conditional upsert, rows locked in quota order); the takes answer in
    /// the order of `asks`, with 0 taken where a window had too little left.
    pub async fn take_slots_across(
        &self,
        asks: &[QuotaAsk],
    ) -> Result<Vec<QuotaTake>, sqlx::Error> {
        let quotas: Vec<String> = asks.iter().map(|a| a.quota.clone()).collect();
        let wanted: Vec<i64> = asks.iter().map(|a| a.wanted).collect();
        let ceilings: Vec<i64> = asks.iter().map(|a| a.ceiling).collect();
        let smallest: Vec<i64> = asks.iter().map(|a| a.smallest).collect();
        let rows = sqlx::query_file!(
            "sql/take_slots_across.sql",
            &quotas,
            &wanted,
            &ceilings,
            &smallest
        )
        .fetch_all(self.pool())
        .await?;
        let clock = rows
            .first()
            .map(|row| clock_reading!(row))
            .ok_or(sqlx::Error::RowNotFound)?;
        Ok(asks
            .iter()
            .map(|ask| {
                let row = rows.iter().find(|r| r.quota.as_deref() == Some(&ask.quota));
                QuotaTake {
                    clock,
                    taken: row.and_then(|r| r.taken).unwrap_or(0),
                    count_after: row.and_then(|r| r.count_after),
                }
            })
            .collect())
    }

    /// One conditional upsert (design.md §3.2, §8): takes `least(k, what is
    /// left)` of `quota`'s current window. The caller guards `ceiling < 1`.
    pub async fn take_slots(&self, quota: &str, k: i64, ceiling: i64) -> Result<Take, sqlx::Error> {
        let row = sqlx::query_file!("sql/take_slots.sql", quota, k, ceiling)
            .fetch_one(self.pool())
            .await?;
        let clock = clock_reading!(row);
        Ok(Take {
            clock,
            taken: row.taken,
            count_after: row.count_after,
            stopped_by: (row.taken < k).then(|| Deferral::budget(&clock)),
        })
    }

    /// Decrements the window the slots were taken from (never another one).
    async fn give_back_slots(
        &self,
        quota: &str,
        window_start: DateTime<Utc>,
        slots: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query_file!("sql/give_back_slots.sql", quota, window_start, slots)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Gives back slots a take got that no request uses. A failure leaves
    /// them counted as spent — an over-count, never an under-count — and is
    /// logged here, once, for every path that gives back.
    pub(crate) async fn give_back_unused(
        &self,
        quota: &str,
        window_start: DateTime<Utc>,
        slots: i64,
    ) {
        if slots < 1 {
            return;
        }
        if let Err(error) = self.give_back_slots(quota, window_start, slots).await {
            tracing::warn!(%error, quota, slots, "slots not given back: counted as spent");
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, Utc};

    use super::*;
    use crate::domain::decision::Limit;

    /// A take of 3 for a group that wanted 5, stopped by the cadence.
    fn short_take() -> Take {
        let now = Utc::now();
        let clock = ClockReading {
            db_now: now,
            window_start: now - Duration::minutes(1),
            window_end: now + Duration::minutes(59),
        };
        Take {
            clock,
            taken: 3,
            count_after: Some(3),
            stopped_by: Some(Deferral {
                limit: Limit::Cadence,
                retry_at: now + Duration::seconds(2),
            }),
        }
    }

    #[test]
    fn a_claim_served_in_full_hears_no_refusal() {
        let take = short_take();
        let served = take.share_of(2, 2);
        assert_eq!(served.taken, 2);
        assert!(served.stopped_by.is_none());
        assert_eq!(served.count_after, take.count_after);
        assert_eq!(served.clock.window_start, take.clock.window_start);
    }

    #[test]
    fn a_claim_served_short_hears_what_stopped_the_take() {
        let take = short_take();
        for (share, wanted) in [(1, 3), (0, 1)] {
            let short = take.share_of(share, wanted);
            assert_eq!(short.taken, share);
            assert_eq!(short.stopped_by, take.stopped_by, "{share} of {wanted}");
        }
    }
}
