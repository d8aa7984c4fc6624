//! Estimates settled to the actual (design.md §12). A grant of an estimate
//! is recorded with the windows it was taken from and the key that asked;
//! its settlement, once and within `settle_within`, gives back to the
//! windows still open what was over-estimated, or takes what was
//! under-estimated without any ceiling (it already happened), tallied
//! `overspent`.

use super::Reservations;
use crate::domain::decision::{Decision, Outcome, SlotRequest};
use crate::shell::Operation;
use crate::store::{OpenReservation, SettledWindow, Settlement, StoreError};

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
    pub quota: String,
    pub flow: String,
    pub estimated: i64,
    pub spent: i64,
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
        let open = OpenReservation {
            quota: quota.clone(),
            flow: decision.flow.clone(),
            estimated: request.count,
            windows: windows
                .iter()
                .map(|w| (w.period.clone(), w.window_start, w.ends_at))
                .collect(),
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

    /// Settles reservation `id` at `spent` of `quota` (`None`: as
    /// estimated), if `settler` may.
    pub(crate) async fn settle(
        &self,
        id: i64,
        quota: Option<&str>,
        spent: Option<i64>,
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
            if let Some(named) = quota.filter(|named| *named != reservation.quota) {
                return Err(SettleError::Invalid(format!(
                    "`spent` names `{named}`; reservation {id} spent quota `{}`",
                    reservation.quota
                )));
            }
            Ok(spent.unwrap_or(reservation.estimated))
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
                quota: reservation.quota,
                flow: reservation.flow,
                estimated: reservation.estimated,
                spent,
                windows,
            }),
        }
    }
}
