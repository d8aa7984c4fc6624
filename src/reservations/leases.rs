//! What follows a grant: the in-flight place it holds, recorded under the
//! key that took it (the lease holder) and freed when its emission is over;
//! the upstream's answer that adapts the quota's cadence.

use super::Reservations;
use crate::shell::Operation;
use crate::store::{AdaptedCadence, LeaseRelease, LeaseScope, ReleaseAsk, StoreError};

impl Reservations {
    /// Records that key `key_id` took `leases`, so that only it (or an
    /// admin) frees them.
    pub async fn hold_leases(&self, leases: &[i64], key_id: i64) -> Result<(), StoreError> {
        let held = self.store.hold_leases(leases, key_id);
        self.shell.run(Operation::HoldLease, held).await
    }

    /// The key that took lease `lease_id`, if one was recorded.
    pub async fn lease_holder(&self, lease_id: i64) -> Result<Option<i64>, StoreError> {
        let holder = self.store.lease_holder(lease_id);
        self.shell.run(Operation::HoldLease, holder).await
    }

    /// Frees lease `lease_id`'s place, if it is still held and granted to
    /// `scope`, and feeds `held_seconds` (or the time since it was taken)
    /// into the flow's average hold time; together with the concurrent
    /// releases of this replica (one statement per group).
    pub async fn release_lease(
        &self,
        lease_id: i64,
        held_seconds: Option<f64>,
        scope: &LeaseScope,
    ) -> Result<LeaseRelease, StoreError> {
        let ask = ReleaseAsk {
            lease_id,
            held_seconds,
            scope: scope.clone(),
        };
        let released = self.releases.release(ask);
        self.shell.run(Operation::ReleaseLease, released).await
    }

    /// Adapts `quota`'s cadence to an upstream's `status`, together with the
    /// concurrent reports of this replica (one statement per group); `None`
    /// when the quota has no adaptive cadence or the status says nothing of
    /// the rate.
    pub async fn adapt_cadence(
        &self,
        quota: &str,
        status: u16,
    ) -> Result<Option<AdaptedCadence>, StoreError> {
        let adapted = self.releases.report(quota.to_string(), status);
        self.shell.run(Operation::AdaptCadence, adapted).await
    }
}
