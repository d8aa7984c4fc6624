//! Paced quotas (a cadence, in-flight places or both): groups of asks, one
//! per quota, take budget slots, cadence tokens and in-flight places in one
//! statement across quotas (`sql/take_paced_across.sql`), and what rationing
//! says nobody uses goes back in one statement per quota
//! (`sql/give_back_paced.sql`). A grant gets its slots, its tokens and its
//! place, or none of them.

use super::slots::{counted, WindowArrays};
use super::{Lease, Store, Take};
use crate::domain::catalog::QuotaRule;
use crate::domain::decision::{Deferral, Limit, Outlook};
use crate::domain::window::{self, WindowCount};
use crate::domain::ClockReading;
use chrono::{DateTime, Utc};

/// What a group of asks on one paced quota asks of one statement.
#[derive(Clone, Copy, Debug)]
pub struct PacedAsks<'a> {
    /// Each ask's slots (and as many tokens), in rationing order.
    pub slots: &'a [i64],
    /// Each ask's flow, in the same order: a place leased for an ask is held
    /// by its flow. May be empty when no ask needs a place.
    pub flows: &'a [String],
    /// The share of each window's ceiling the asks may reach: the widest
    /// of theirs (`None`: all of it).
    pub share: Option<i16>,
    /// Every ask needs an in-flight place (enforced asks on a quota with
    /// `max_in_flight`).
    pub need_places: bool,
}

/// A lease the take made, held for now by the flow of one of the asks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LabelledLease {
    pub lease: Lease,
    /// Index (into the asks) of the ask whose flow the lease was made for.
    pub ask: usize,
}

/// What a group take answered.
#[derive(Clone, Debug)]
pub struct PacedTake {
    pub clock: ClockReading,
    /// The quota's windows as the take found them.
    pub windows: Vec<WindowCount>,
    /// Budget slots taken in every window, and as many tokens.
    pub taken: i64,
    /// What stopped the take short of what was asked: the budget, the
    /// cadence's tokens or the free in-flight places.
    pub slots_bound_by: Limit,
    /// In-flight places leased, in the order of the asks they were made for.
    pub leases: Vec<LabelledLease>,
    /// When the earliest live lease of the quota expires (`None`: none is live).
    pub first_lease_expiry: Option<DateTime<Utc>>,
    /// The quota's flows' average hold time, read when the places bound
    /// the take.
    typical_hold: Option<f64>,
    /// The bucket when the take began: tokens and the rate they refill at.
    bucket: Option<(f64, f64)>,
}

impl PacedTake {
    /// What the take read of when each limit lifts: the answer of a
    /// refusal is `Deferral::by` on it.
    pub(crate) fn outlook(&self) -> Outlook {
        Outlook {
            clock: self.clock,
            bucket: self.bucket,
            first_lease_expiry: self.first_lease_expiry,
            typical_hold: self.typical_hold.and_then(hold_duration),
            reopening: None,
        }
    }

    /// Whole tokens in the bucket when the take began; `None` without a cadence.
    pub fn tokens(&self) -> Option<i64> {
        self.outlook().tokens()
    }
}

/// A hold time in seconds as a duration (none for what is not one).
pub(super) fn hold_duration(seconds: f64) -> Option<chrono::Duration> {
    (seconds.is_finite() && seconds >= 0.0)
        .then(|| chrono::Duration::microseconds((seconds * 1e6).round() as i64))
}

/// The statement's parameters: one element per quota, the asks of them all
/// end to end (a quota's are `slots[lo - 1..hi]`, SQL counting from 1).
#[derive(Default)]
struct PacedArrays {
    quotas: Vec<String>,
    lo: Vec<i32>,
    hi: Vec<i32>,
    windows: WindowArrays,
    need_places: Vec<bool>,
    rates: Vec<Option<f64>>,
    bursts: Vec<Option<f64>>,
    adaptive: Vec<bool>,
    slots: Vec<i64>,
    flows: Vec<String>,
}

impl PacedArrays {
    fn push(&mut self, quota: &QuotaRule, asks: &PacedAsks<'_>, regardless: bool) {
        let cadence = quota.cadence;
        let lo = self.slots.len() + 1;
        self.slots.extend_from_slice(asks.slots);
        // Every ask has a flow, so that the slices line up.
        let named = asks
            .flows
            .iter()
            .cloned()
            .chain(std::iter::repeat(String::new()));
        self.flows.extend(named.take(asks.slots.len()));
        self.quotas.push(quota.name.clone());
        self.lo.push(i32::try_from(lo).unwrap_or(i32::MAX));
        self.hi
            .push(i32::try_from(self.slots.len()).unwrap_or(i32::MAX));
        self.windows.push(
            self.quotas.len() - 1,
            &quota.windows,
            asks.share,
            regardless,
        );
        self.need_places.push(asks.need_places);
        self.rates.push(cadence.map(|c| c.rate));
        self.bursts.push(cadence.map(|c| c.burst));
        self.adaptive.push(cadence.is_some_and(|c| c.adaptive));
    }
}

/// What goes back after a group take.
#[derive(Clone, Copy, Debug, Default)]
pub struct PacedGiveBack<'a> {
    pub slots: i64,
    /// Tokens back to the bucket (never above its burst).
    pub tokens: i64,
    /// Leases nobody holds: their places are freed.
    pub freed: &'a [i64],
    /// Leases handed to another flow of the group than they were made for.
    pub handed: &'a [(i64, String)],
}

impl PacedGiveBack<'_> {
    pub fn is_empty(&self) -> bool {
        self.slots == 0 && self.tokens == 0 && self.freed.is_empty() && self.handed.is_empty()
    }
}

impl Store {
    /// One statement for groups of asks on paced quotas, one group per
    /// quota (`spend_regardless`: observe mode, every slot spent, tokens as
    /// far as they go, no place). Answers each group's take, in the order of
    /// `groups`; the caller shares each out.
    pub async fn take_paced_across(
        &self,
        groups: &[(&QuotaRule, PacedAsks<'_>)],
        spend_regardless: bool,
    ) -> Result<Vec<PacedTake>, sqlx::Error> {
        let mut arrays = PacedArrays::default();
        for (quota, asks) in groups {
            arrays.push(quota, asks, spend_regardless);
        }
        let rows = sqlx::query_file!(
            "sql/take_paced_across.sql",
            &arrays.quotas,
            &arrays.lo,
            &arrays.hi,
            &arrays.need_places,
            &arrays.rates as &[Option<f64>],
            &arrays.bursts as &[Option<f64>],
            &arrays.adaptive,
            &arrays.slots,
            &arrays.flows,
            &arrays.windows.quota,
            &arrays.windows.periods,
            &arrays.windows.zones as &[Option<String>],
            &arrays.windows.ceilings,
            spend_regardless
        )
        .fetch_all(self.pool())
        .await?;
        let mut takes: Vec<Option<PacedTake>> = vec![None; groups.len()];
        for row in rows {
            let leases = row
                .lease_ids
                .iter()
                .zip(&row.lease_valid_until)
                .zip(&row.lease_asks)
                .map(|((&id, &valid_until), &ask)| LabelledLease {
                    lease: Lease { id, valid_until },
                    // Ordinalities count from 1.
                    ask: usize::try_from(ask - 1).unwrap_or_default(),
                })
                .collect();
            let index = usize::try_from(row.quota_index - 1).unwrap_or(usize::MAX);
            let Some((quota, _)) = groups.get(index) else {
                continue;
            };
            let take = PacedTake {
                clock: clock_reading!(row),
                windows: counted(
                    &quota.windows,
                    &row.window_starts,
                    &row.window_ends,
                    &row.counts_before,
                ),
                taken: row.taken,
                slots_bound_by: if row.tokens_bound {
                    Limit::Cadence
                } else if row.places_bound {
                    Limit::InFlight
                } else {
                    Limit::Budget
                },
                leases,
                first_lease_expiry: row.first_lease_expiry,
                typical_hold: row.typical_hold,
                bucket: row.tokens.zip(row.rate),
            };
            if let Some(slot) = takes.get_mut(index) {
                *slot = Some(take);
            }
        }
        takes
            .into_iter()
            .map(|take| take.ok_or_else(|| sqlx::Error::RowNotFound))
            .collect()
    }

    /// An enforced group of asks on one paced quota alone (a claim's lane).
    pub async fn take_paced_group(
        &self,
        quota: &QuotaRule,
        asks: &PacedAsks<'_>,
    ) -> Result<PacedTake, sqlx::Error> {
        let mut takes = self.take_paced_across(&[(quota, *asks)], false).await?;
        takes.pop().ok_or(sqlx::Error::RowNotFound)
    }

    /// Gives back to `quota`'s `windows` (those the take took from), its
    /// bucket and its places what a group take took and no grant uses, in
    /// one statement.
    pub async fn give_back_paced(
        &self,
        quota: &QuotaRule,
        windows: &[WindowCount],
        back: &PacedGiveBack<'_>,
    ) -> Result<(), sqlx::Error> {
        if back.is_empty() {
            return Ok(());
        }
        let cadence = quota.cadence;
        let (handed, holders): (Vec<i64>, Vec<String>) = back.handed.iter().cloned().unzip();
        let periods: Vec<String> = windows.iter().map(|w| w.period.to_string()).collect();
        let starts: Vec<DateTime<Utc>> = windows.iter().map(|w| w.window_start).collect();
        sqlx::query_file!(
            "sql/give_back_paced.sql",
            quota.name,
            &periods,
            &starts,
            back.slots,
            back.tokens,
            cadence.map(|c| c.burst),
            cadence.is_some_and(|c| c.adaptive),
            back.freed,
            &handed,
            &holders
        )
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Takes up to `k` single slots of a cadence quota (a claim's lane), each
    /// with its token, in one statement.
    pub async fn take_paced_slots(
        &self,
        quota: &QuotaRule,
        k: i64,
        share: Option<i16>,
    ) -> Result<Take, sqlx::Error> {
        let slots = vec![1; usize::try_from(k).unwrap_or_default()];
        let asks = PacedAsks {
            slots: &slots,
            flows: &[],
            share,
            need_places: false,
        };
        let take = self.take_paced_group(quota, &asks).await?;
        let stopped_by = (take.taken < k).then(|| {
            let refusing = window::refusing(&take.windows, share, take.taken, 1);
            let outlook = take.outlook().refused_by(refusing);
            // A full window outranks missing tokens: they come back sooner.
            let limit = if refusing.is_some() {
                Limit::Budget
            } else {
                take.slots_bound_by
            };
            Deferral::by(limit, &outlook, take.taken + 1)
        });
        Ok(Take {
            clock: take.clock,
            taken: take.taken,
            windows: take.windows,
            stopped_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing to give back spares the group a statement; anything at all
    /// to give back (slots without tokens: a quota with places and no
    /// cadence) runs it.
    #[test]
    fn a_give_back_is_empty_only_when_every_part_of_it_is() {
        assert!(PacedGiveBack::default().is_empty());
        let handed = [(7, "sync".to_string())];
        let each_part = [
            PacedGiveBack {
                slots: 1,
                ..PacedGiveBack::default()
            },
            PacedGiveBack {
                tokens: 1,
                ..PacedGiveBack::default()
            },
            PacedGiveBack {
                freed: &[7],
                ..PacedGiveBack::default()
            },
            PacedGiveBack {
                handed: &handed,
                ..PacedGiveBack::default()
            },
        ];
        for back in each_part {
            assert!(!back.is_empty(), "{back:?}");
        }
    }
}
