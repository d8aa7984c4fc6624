//! Estimates settled to the actual (design.md §12). A grant of an estimate
//! is recorded with the windows it was taken from and the key that asked;
//! its settlement, once and within `settle_within`, gives back to the
//! windows still open what was over-estimated, or takes what was
//! under-estimated without any ceiling (it already happened), tallied
//! `overspent`.

use super::Reservations;
use crate::domain::decision::{Decision, Outcome, SlotRequest};
use crate::shell::Operation;
use std::collections::BTreeMap;

use crate::store::{OpenReservation, ReservedQuota, SettledWindow, Settlement, StoreError};

/// Who settles: anyone without keys, an admin, or the key that reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settler {
    Anyone,
    Admin,
    Key(i64),
}

/// Why a settlement was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SettleError {
    #[error("no reservation {0} to settle (unknown, or past its time and pruned)")]
    NotFound(i64),
    #[error("reservation {0} was not made by this key; it is not settled")]
    NotYours(i64),
    #[error("reservation {0} is settled already")]
    AlreadySettled(i64),
    #[error("reservation {0} is past its time to settle: it stays spent as estimated")]
    TooLate(i64),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A settlement, as answered.
#[derive(Clone, Debug)]
pub(crate) struct Settled {
    pub flow: String,
    /// Each quota the reservation spent, the flow's own first: what was
    /// estimated and what was spent.
    pub quotas: Vec<(String, i64, i64)>,
    /// The windows still open it changed, with their counts after.
    pub windows: Vec<SettledWindow>,
}

impl Reservations {
    /// A grant of an estimate (`request.settle`) the store counted is
    /// recorded to be settled, by `key_id`; its answer names the record.
    /// Not recorded (the store failed), the grant stands, spent as
    /// estimated, without an id.
    pub(crate) async fn open_settlement(
        &self,
        decision: &mut Decision,
        request: &SlotRequest,
        key_id: Option<i64>,
    ) {
        let counted = decision.outcome == Outcome::Granted && !decision.would_defer;
        let (Some(quota), Some(windows), true) = (&decision.quota, &decision.windows, counted)
        else {
            return;
        };
        if !request.settle || windows.iter().any(|w| w.left.is_none()) {
            return;
        }
        // The answer's windows, quota by quota in the flow's order.
        let mut quotas: Vec<ReservedQuota> = Vec::new();
        for window in windows {
            if quotas.last().is_none_or(|q| q.quota != window.quota) {
                quotas.push(ReservedQuota {
                    quota: window.quota.clone(),
                    estimated: request.amount_of(&window.quota),
                    windows: Vec::new(),
                });
            }
            if let Some(last) = quotas.last_mut() {
                last.windows
                    .push((window.period.clone(), window.window_start, window.ends_at));
            }
        }
        let open = OpenReservation {
            flow: decision.flow.clone(),
            quotas,
            key_id,
        };
        let recorded = self.store.open_reservation(&open);
        match self.shell.run(Operation::Settle, recorded).await {
            Ok(id) => decision.reservation_id = Some(id),
            Err(error) => {
                tracing::warn!(%error, quota, "a reservation to settle not recorded: it stays spent as estimated")
            }
        }
    }

    /// Settles reservation `id` at what `spent` names of its quotas (a
    /// quota it does not name: as estimated), if `settler` may.
    pub(crate) async fn settle(
        &self,
        id: i64,
        spent: &BTreeMap<String, i64>,
        settler: Settler,
    ) -> Result<Settled, SettleError> {
        let rule = |locked: &crate::store::LockedReservation| {
            let reservation = &locked.reservation;
            let allowed = match settler {
                Settler::Anyone | Settler::Admin => true,
                Settler::Key(key) => reservation.key_id == Some(key),
            };
            if !allowed {
                return Err(SettleError::NotYours(id));
            }
            if locked.settled {
                return Err(SettleError::AlreadySettled(id));
            }
            if locked.expired {
                return Err(SettleError::TooLate(id));
            }
            let spent_quota = |named: &String| reservation.quotas.iter().any(|q| q.quota == *named);
            if let Some(named) = spent.keys().find(|named| !spent_quota(named)) {
                let quotas: Vec<String> = reservation
                    .quotas
                    .iter()
                    .map(|q| format!("`{}`", q.quota))
                    .collect();
                return Err(SettleError::Invalid(format!(
                    "`spent` names `{named}`; reservation {id} spent {}",
                    quotas.join(", ")
                )));
            }
            Ok(reservation
                .quotas
                .iter()
                .map(|q| spent.get(&q.quota).copied().unwrap_or(q.estimated))
                .collect())
        };
        let settling = self.store.settle_reservation(id, rule, self.settle_within);
        match self.shell.run(Operation::Settle, settling).await? {
            Settlement::NotFound => Err(SettleError::NotFound(id)),
            Settlement::Refused(why) => Err(why),
            Settlement::Settled {
                reservation,
                spent,
                windows,
            } => Ok(Settled {
                flow: reservation.flow,
                quotas: reservation
                    .quotas
                    .into_iter()
                    .zip(spent)
                    .map(|(q, spent)| (q.quota, q.estimated, spent))
                    .collect(),
                windows,
            }),
        }
    }
}
