//! Calls that spend several quotas at once (design.md §12): one statement
//! decides a group of them, each all or nothing across every window of
//! every quota it spends (`sql/functions/take_linked.sql`).

use super::slots::WindowArrays;
use super::Store;
use crate::domain::catalog::QuotaRule;
use crate::domain::window::WindowCount;
use crate::domain::ClockReading;

/// One call: what it spends of each of its quotas, in the flow's order,
/// with the share of each window's ceiling its flow's priority may reach
/// in that quota (`None`: all of it).
pub struct SeveralAsk<'a> {
    pub quotas: Vec<(&'a QuotaRule, i64, Option<i16>)>,
}

/// What the statement answered for one call.
#[derive(Clone, Debug)]
pub struct SeveralTake {
    pub clock: ClockReading,
    /// Spent (granted, or observed).
    pub spent: bool,
    /// Every window had room for it at its turn: what enforcement grants.
    pub fits: bool,
    /// Each quota's windows at the call's turn (the calls decided before it
    /// counted), in the call's order.
    pub windows: Vec<Vec<WindowCount>>,
}

/// The legs of `calls`, end to end, as the statement takes them: leg i is
/// one window of one quota of call `windows.quota[i]` (from 1), with the
/// ceiling the call's flow may reach there (`WindowArrays`, as the
/// one-quota takes lay windows out), its quota's name and its amount.
#[derive(Default)]
struct Legs {
    windows: WindowArrays,
    quota: Vec<String>,
    amount: Vec<i64>,
}

impl Legs {
    fn of(calls: &[SeveralAsk<'_>]) -> Self {
        let mut legs = Legs::default();
        for (i, call) in calls.iter().enumerate() {
            for (quota, amount, share) in &call.quotas {
                legs.windows.push(i, &quota.windows, *share, false);
                for _ in &quota.windows {
                    legs.quota.push(quota.name.clone());
                    legs.amount.push(*amount);
                }
            }
        }
        legs
    }
}

impl Store {
    /// Decides `calls` in the order given, first fit, in one statement:
    /// each spends every window of every quota it names, or none.
    /// `regardless` (observe mode): each is spent whatever the counts, and
    /// still told whether it fit.
    pub(crate) async fn take_several(
        &self,
        calls: &[SeveralAsk<'_>],
        regardless: bool,
    ) -> Result<Vec<SeveralTake>, sqlx::Error> {
        let legs = Legs::of(calls);
        let rows = sqlx::query_file!(
            "sql/take_linked.sql",
            &legs.windows.quota,
            &legs.quota,
            &legs.windows.periods,
            &legs.windows.zones as &[Option<String>],
            &legs.amount,
            &legs.windows.ceilings,
            regardless
        )
        .fetch_all(self.pool())
        .await?;
        if rows.len() != legs.quota.len() {
            return Err(sqlx::Error::RowNotFound);
        }
        let mut rows = rows.into_iter();
        let mut takes = Vec::with_capacity(calls.len());
        for call in calls {
            let mut take: Option<SeveralTake> = None;
            let mut windows = Vec::with_capacity(call.quotas.len());
            for (quota, _, _) in &call.quotas {
                let mut counted = Vec::with_capacity(quota.windows.len());
                for window in &quota.windows {
                    let row = rows.next().ok_or(sqlx::Error::RowNotFound)?;
                    counted.push(WindowCount {
                        period: window.period,
                        window_start: row.window_start,
                        window_end: row.window_end,
                        ceiling: window.ceiling,
                        count_before: row.count_before,
                    });
                    take.get_or_insert_with(|| SeveralTake {
                        clock: ClockReading {
                            db_now: row.db_now,
                            window_start: row.hour_start,
                            window_end: row.hour_end,
                        },
                        spent: row.granted,
                        fits: row.fits,
                        windows: Vec::new(),
                    });
                }
                windows.push(counted);
            }
            let mut take = take.ok_or(sqlx::Error::RowNotFound)?;
            take.windows = windows;
            takes.push(take);
        }
        Ok(takes)
    }
}
