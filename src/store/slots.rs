//! Taking up to k slots in every window of a quota in one call, and giving
//! back what no item used.

use super::Store;
use crate::domain::catalog::QuotaRule;
use crate::domain::decision::Deferral;
use crate::domain::window::{self, WindowCount, WindowRule};
use crate::domain::ClockReading;

/// What a take of one quota answered.
#[derive(Clone, Debug)]
pub struct Take {
    pub clock: ClockReading,
    /// Slots taken in every window: `least(k, what the fullest has left)`,
    /// 0 when that is too little.
    pub taken: i64,
    /// The quota's windows as the take found them.
    pub windows: Vec<WindowCount>,
    /// Fewer than asked were taken: the limit that stopped the take, and
    /// when it lifts.
    pub stopped_by: Option<Deferral>,
}

/// One quota's part of a take across quotas: what its group asked.
#[derive(Clone, Debug)]
pub struct QuotaAsk {
    pub quota: String,
    /// The quota's windows, as the group's latest arrival saw them.
    pub windows: Vec<WindowRule>,
    /// The share of each window's ceiling the group may reach: the widest
    /// of its requests' (`None`: all of it).
    pub share: Option<i16>,
    /// Slots asked for the quota's whole group.
    pub wanted: i64,
    /// The smallest request of the group: fewer slots left than this is nothing.
    pub smallest: i64,
}

/// One quota's part of a take across quotas: what its group got. No
/// refusal: the group's requests are rationed the take, and each refusal is
/// built from that.
#[derive(Clone, Debug)]
pub struct QuotaTake {
    pub clock: ClockReading,
    /// Slots taken in every window, 0 when the fullest had too little left.
    pub taken: i64,
    /// The quota's windows as the take found them, in the order asked.
    pub windows: Vec<WindowCount>,
}

impl Take {
    /// One claim's part of a take its group shared (design.md §9): `share` of
    /// the slots, for a claim that wanted `wanted`. Only a claim that got
    /// less than it wanted hears what stopped the take: a claim served in
    /// full was held back by nothing, whatever its neighbours got.
    pub(crate) fn share_of(&self, share: i64, wanted: i64) -> Take {
        Take {
            taken: share,
            stopped_by: if share < wanted {
                self.stopped_by
            } else {
                None
            },
            ..self.clone()
        }
    }
}

impl QuotaAsk {
    /// Observe mode: `slots` of `quota` spent in every window whatever its
    /// count, so that each count stays the honest record of every slot spent.
    pub fn regardless(quota: &QuotaRule, slots: i64) -> Self {
        QuotaAsk {
            quota: quota.name.clone(),
            windows: quota.windows.clone(),
            share: None,
            wanted: slots,
            smallest: slots,
        }
    }
}

/// The windows of every quota of a call, end to end, as the statements
/// take them (`sql/functions/take_windows.sql`): window j is of quota
/// `quota[j]` (from 1), with the ceiling its group may reach.
#[derive(Default)]
pub(super) struct WindowArrays {
    pub quota: Vec<i32>,
    pub periods: Vec<String>,
    pub zones: Vec<Option<String>>,
    pub ceilings: Vec<i64>,
}

impl WindowArrays {
    /// Quota number `index` (from 0) has `windows`, of which its group may
    /// reach `share`; `regardless`: no ceiling (observe mode).
    pub(super) fn push(
        &mut self,
        index: usize,
        windows: &[WindowRule],
        share: Option<i16>,
        regardless: bool,
    ) {
        for window in windows {
            self.quota
                .push(i32::try_from(index + 1).unwrap_or(i32::MAX));
            self.periods.push(window.period.to_string());
            self.zones.push(window.zone.clone());
            self.ceilings.push(if regardless {
                i64::MAX
            } else {
                window.ceiling_for(share)
            });
        }
    }
}

/// The windows a statement answered for a quota: `windows`' bounds and
/// counts in the order asked.
pub(super) fn counted(
    windows: &[WindowRule],
    starts: &[chrono::DateTime<chrono::Utc>],
    ends: &[chrono::DateTime<chrono::Utc>],
    counts_before: &[i64],
) -> Vec<WindowCount> {
    windows
        .iter()
        .zip(starts.iter().zip(ends).zip(counts_before))
        .map(
            |(rule, ((&window_start, &window_end), &count_before))| WindowCount {
                period: rule.period,
                window_start,
                window_end,
                ceiling: rule.ceiling,
                count_before,
            },
        )
        .collect()
}

/// The takes of `asks`, one row each in their order (either statement's):
/// its clock, slots taken, and its windows' starts, ends and counts before.
fn answered<S, E, C>(
    asks: &[QuotaAsk],
    rows: impl ExactSizeIterator<Item = (ClockReading, i64, S, E, C)>,
) -> Result<Vec<QuotaTake>, sqlx::Error>
where
    S: AsRef<[chrono::DateTime<chrono::Utc>]>,
    E: AsRef<[chrono::DateTime<chrono::Utc>]>,
    C: AsRef<[i64]>,
{
    if rows.len() != asks.len() {
        return Err(sqlx::Error::RowNotFound);
    }
    Ok(asks
        .iter()
        .zip(rows)
        .map(|(ask, (clock, taken, starts, ends, counts))| QuotaTake {
            clock,
            taken,
            windows: counted(
                &ask.windows,
                starts.as_ref(),
                ends.as_ref(),
                counts.as_ref(),
            ),
        })
        .collect())
}

impl Store {
    /// One call takes slots of every quota in `asks`, all or nothing across
    /// each quota's windows (rows locked in key order); the takes answer in
    /// the order of `asks`, with 0 taken where a window had too little left.
    /// `regardless`: observe mode, every slot spent whatever the counts.
    pub async fn take_slots_across(
        &self,
        asks: &[QuotaAsk],
        regardless: bool,
    ) -> Result<Vec<QuotaTake>, sqlx::Error> {
        let (quotas, wanted, smallest) = (
            asks.iter().map(|a| a.quota.clone()).collect::<Vec<_>>(),
            asks.iter().map(|a| a.wanted).collect::<Vec<_>>(),
            asks.iter().map(|a| a.smallest).collect::<Vec<_>>(),
        );
        let mut windows = WindowArrays::default();
        for (index, ask) in asks.iter().enumerate() {
            windows.push(index, &ask.windows, ask.share, regardless);
        }
        if asks.iter().all(|ask| ask.windows.len() == 1) {
            // One conditional upsert per quota (`sql/take_one_window.sql` says why).
            let rows = sqlx::query_file!(
                "sql/take_one_window.sql",
                &quotas,
                &wanted,
                &windows.periods,
                &windows.zones as &[Option<String>],
                &windows.ceilings,
                &smallest
            )
            .fetch_all(self.pool())
            .await?;
            let takes = rows.into_iter().map(|row| {
                let starts = [row.quota_window_start];
                let ends = [row.quota_window_end];
                (
                    clock_reading!(row),
                    row.taken,
                    starts,
                    ends,
                    [row.count_before],
                )
            });
            return answered(asks, takes);
        }
        let rows = sqlx::query_file!(
            "sql/take_windows.sql",
            &quotas,
            &wanted,
            &smallest,
            &windows.quota,
            &windows.periods,
            &windows.zones as &[Option<String>],
            &windows.ceilings,
            regardless
        )
        .fetch_all(self.pool())
        .await?;
        let takes = rows.into_iter().map(|row| {
            let clock = clock_reading!(row);
            (
                clock,
                row.taken,
                row.window_starts,
                row.window_ends,
                row.counts_before,
            )
        });
        answered(asks, takes)
    }

    /// Takes `least(k, what is left)` of every window of `quota` for a flow
    /// that may use `share` of each (a claim's lane), all or nothing across
    /// the windows (design.md §3.2, §12).
    pub async fn take_slots(
        &self,
        quota: &QuotaRule,
        k: i64,
        share: Option<i16>,
    ) -> Result<Take, sqlx::Error> {
        let ask = QuotaAsk {
            quota: quota.name.clone(),
            windows: quota.windows.clone(),
            share,
            wanted: k,
            smallest: 1,
        };
        let take = self
            .take_slots_across(std::slice::from_ref(&ask), false)
            .await?
            .pop()
            .ok_or(sqlx::Error::RowNotFound)?;
        let stopped_by = (take.taken < k)
            .then(|| window::refusing(&take.windows, share, take.taken, 1))
            .flatten()
            .map(Deferral::budget);
        Ok(Take {
            clock: take.clock,
            taken: take.taken,
            windows: take.windows,
            stopped_by,
        })
    }

    /// Decrements the windows the slots were taken from (never others).
    async fn give_back_slots(
        &self,
        quota: &str,
        windows: &[WindowCount],
        slots: i64,
    ) -> Result<(), sqlx::Error> {
        let periods: Vec<String> = windows.iter().map(|w| w.period.to_string()).collect();
        let starts: Vec<_> = windows.iter().map(|w| w.window_start).collect();
        sqlx::query_file!("sql/give_back_slots.sql", quota, &periods, &starts, slots)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Gives back slots a take got that no request uses. A failure leaves
    /// them counted as spent — an over-count, never an under-count — and is
    /// logged here, once, for every path that gives back.
    pub(crate) async fn give_back_unused(&self, quota: &str, windows: &[WindowCount], slots: i64) {
        if slots < 1 || windows.is_empty() {
            return;
        }
        if let Err(error) = self.give_back_slots(quota, windows, slots).await {
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
            windows: Vec::new(),
            stopped_by: Some(Deferral {
                limit: Limit::Cadence,
                retry_at: now + Duration::seconds(2),
                period: None,
            }),
        }
    }

    #[test]
    fn a_claim_served_in_full_hears_no_refusal() {
        let take = short_take();
        let served = take.share_of(2, 2);
        assert_eq!(served.taken, 2);
        assert!(served.stopped_by.is_none());
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
