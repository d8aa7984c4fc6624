//! The claim's transaction: lease the most urgent claimable items the claims
//! of one group may have (concurrent claims of the same flows share it). The
//! slots of its enforced lanes were taken before, each by a statement of its
//! own (so no claim holds a quota's window row while it looks for items);
//! this transaction only locks items and in-flight places and leases them,
//! each to the claim it falls to, and says how many of each lane's slots its
//! items use.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::leases::places_outlook;
use super::work::{
    first_look, lease, lease_places, lock_candidates, lock_candidates_with_spend, lock_free_places,
    Candidate, FirstLook, Lane, PlaceLease,
};
use super::{Store, StoreTransaction, Take, WorkItem};
use crate::domain::catalog::QuotaRule;
use crate::domain::decision::{Deferral, Limit, Outcome};
use crate::domain::rationing::share_up_to;

/// How a leased item was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimLane {
    /// Inside the bypass horizon: no slot.
    Due,
    /// Granted from the slots of the enforced lane at this index.
    Enforced(usize),
    Observed,
    Unthrottled,
    /// Decided on its own, like a reservation: an item with a `spend`, or
    /// of a flow that spends several quotas.
    Measured,
}

impl ClaimLane {
    pub fn outcome(self) -> Outcome {
        match self {
            ClaimLane::Due => Outcome::Bypassed,
            ClaimLane::Enforced(_) | ClaimLane::Observed | ClaimLane::Measured => Outcome::Granted,
            ClaimLane::Unthrottled => Outcome::Unthrottled,
        }
    }
}

/// An enforced quota's flows and the slots taken for them.
pub struct EnforcedLane<'a> {
    pub quota: &'a QuotaRule,
    pub flows: &'a [String],
    pub slots: i64,
}

/// A claim of a group, as its transaction sees it: the worker that leases,
/// how many items at most, for how long.
#[derive(Clone, Debug)]
pub struct Claimant {
    pub worker: String,
    pub max: i64,
    pub lease_seconds: f64,
}

/// One group of claims (of the same flows), which share a transaction.
#[derive(Clone, Copy)]
pub struct ClaimGroup<'a> {
    /// The group's claims, first come first.
    pub claimants: &'a [Claimant],
    /// Their flows; `None`: all.
    pub worker_flows: Option<&'a [String]>,
    pub horizon_seconds: f64,
}

impl Claimant {
    /// Items a whole group of claimants may lease.
    pub(crate) fn most_items(claimants: &[Claimant]) -> i64 {
        claimants.iter().map(|claimant| claimant.max).sum()
    }
}

/// A group's claim transaction after its first look: the rest of the
/// transaction leases for the group it began with.
pub struct BegunClaim<'a> {
    /// Held until the transaction ends (`Store::claim_transactions`).
    _open: OwnedSemaphorePermit,
    /// How long the group waited for its turn among the open claim
    /// transactions (`quota_arbiter_claim_wait_seconds`).
    pub waited: Duration,
    tx: StoreTransaction,
    look: FirstLook,
    group: ClaimGroup<'a>,
}

/// What the transaction leased.
pub struct ClaimLeases {
    /// Per claimant (in the group's order), its leased items, most urgent
    /// first, with how each was decided.
    pub items: Vec<Vec<(WorkItem, ClaimLane)>>,
    /// In-flight place leases of the leased enforced items, by item id (a
    /// measured item's is its decision's).
    pub place_leases: HashMap<i64, PlaceLease>,
    /// Slots of each enforced lane its leased items use (the rest go back).
    pub used: Vec<i64>,
    /// An enforced lane whose every in-flight place was leased: when the first frees.
    pub places_full: Option<Deferral>,
}

impl Store {
    /// Up to `want` slots of an enforced quota for a claim's lane (with their
    /// cadence tokens on a cadence quota), in a statement of its own:
    /// committed at once, so no claim holds the window row while it looks
    /// for items; never past `share` of any window.
    pub(crate) async fn take_for_claim(
        &self,
        quota: &QuotaRule,
        want: i64,
        share: Option<i16>,
    ) -> Result<Take, sqlx::Error> {
        match quota.cadence {
            None => self.take_slots(quota, want, share).await,
            Some(_) => self.take_paced_slots(quota, want, share).await,
        }
    }

    /// A transaction whose statements run on generic plans that walk their
    /// indexes (`sql/claim_plan_settings.sql`), begun together with those
    /// settings: one round trip, not two.
    async fn claim_transaction(&self) -> Result<StoreTransaction, sqlx::Error> {
        let begin = concat!(
            "BEGIN;\n",
            include_str!("../../sql/claim_plan_settings.sql")
        );
        self.pool().begin_with(begin).await
    }

    /// Which of `enforced` flows have claimable work outside the bypass
    /// horizon: a hint that spares a claim a take on quotas with nothing to
    /// claim. Locks nothing.
    pub(crate) async fn busy_flows(
        &self,
        worker_flows: Option<&[String]>,
        horizon_seconds: f64,
        enforced: &[String],
    ) -> Result<Vec<String>, sqlx::Error> {
        // A transaction only for its plan settings: this look locks nothing.
        let mut tx = self.claim_transaction().await?;
        let look = first_look(&mut tx, worker_flows, horizon_seconds, 0, enforced).await?;
        tx.commit().await?;
        Ok(look.busy)
    }

    /// Begins a claim's transaction with its first look: the due items and
    /// those of never-throttled flows, locked. It needs no slot, so it can
    /// run while the group's lanes take theirs.
    pub async fn begin_claim<'a>(
        &self,
        group: ClaimGroup<'a>,
    ) -> Result<BegunClaim<'a>, sqlx::Error> {
        let asked = Instant::now();
        let open = self.claim_transactions.clone().acquire_owned().await;
        let open = open.map_err(|_| sqlx::Error::PoolClosed)?;
        let waited = asked.elapsed();
        let mut tx = self.claim_transaction().await?;
        let max = Claimant::most_items(group.claimants);
        let (flows, horizon) = (group.worker_flows, group.horizon_seconds);
        let look = first_look(&mut tx, flows, horizon, max, &[]).await?;
        Ok(BegunClaim {
            _open: open,
            waited,
            tx,
            look,
            group,
        })
    }

    /// The rest of a claim's transaction, begun by
    /// [`begin_claim`](Self::begin_claim), up to its decisions: locks the
    /// `observed` lanes' items, for each `enforced` lane as many items as it
    /// has slots (and free in-flight places), and the `measured` items (with
    /// a `spend`, or of flows that spend several quotas); keeps the best of
    /// them and the due and never-throttled items the first look locked, in
    /// rationing order, up to the group's items. The measured items among
    /// them are decided one by one, like reservations, before
    /// [`lease_locked`](Self::lease_locked) leases what was granted.
    pub async fn lock_claim<'a>(
        &self,
        begun: BegunClaim<'a>,
        observed: &[&[String]],
        enforced: &[EnforcedLane<'_>],
        measured: MeasuredLanes<'_>,
    ) -> Result<LockedClaim<'a>, sqlx::Error> {
        let BegunClaim {
            _open: open,
            waited: _,
            mut tx,
            look,
            group,
        } = begun;
        let lane = |flows| Lane {
            flows,
            worker_flows: group.worker_flows,
            horizon_seconds: group.horizon_seconds,
        };
        let max = Claimant::most_items(group.claimants);
        let mut chosen: Vec<(Candidate, ClaimLane)> =
            look.due.into_iter().map(|c| (c, ClaimLane::Due)).collect();
        chosen.sort_by_key(|(c, _)| c.rank());
        let remaining = max - chosen.len() as i64;
        let mut waiting: Vec<(Candidate, ClaimLane)> = Vec::new();
        let mut free_places = vec![Vec::new(); enforced.len()];
        let mut places_full = None;
        let unthrottled = look.unthrottled.into_iter();
        waiting.extend(unthrottled.map(|c| (c, ClaimLane::Unthrottled)));
        for flows in observed {
            let found = lock_candidates(&mut tx, &lane(flows), remaining, true).await?;
            waiting.extend(found.into_iter().map(|c| (c, ClaimLane::Observed)));
        }
        if !measured.every_item.is_empty() {
            let every = lane(measured.every_item);
            let found = lock_candidates(&mut tx, &every, remaining, false).await?;
            waiting.extend(found.into_iter().map(|c| (c, ClaimLane::Measured)));
        }
        if !measured.with_spend.is_empty() {
            let spending = lane(measured.with_spend);
            let found = lock_candidates_with_spend(&mut tx, &spending, remaining).await?;
            waiting.extend(found.into_iter().map(|c| (c, ClaimLane::Measured)));
        }
        for (index, enforced) in enforced.iter().enumerate() {
            let mut want = enforced.slots.min(remaining);
            if want < 1 {
                // The due items fill every claim: nothing to lock.
                continue;
            }
            if enforced.quota.max_in_flight.is_some() {
                let name = &enforced.quota.name;
                free_places[index] = lock_free_places(&mut tx, name, want).await?;
                want = free_places[index].len() as i64;
                if want == 0 {
                    let outlook = places_outlook(&mut tx, name).await?;
                    places_full = Some(Deferral::by(Limit::InFlight, &outlook, 1));
                }
            }
            let found = lock_candidates(&mut tx, &lane(enforced.flows), want, true).await?;
            let kind = ClaimLane::Enforced(index);
            waiting.extend(found.into_iter().map(|c| (c, kind)));
        }
        waiting.sort_by_key(|(c, _)| c.rank());
        waiting.truncate(remaining.max(0) as usize);
        let mut used = vec![0; enforced.len()];
        let mut place_leases = HashMap::new();
        for (index, enforced) in enforced.iter().enumerate() {
            let items: Vec<&Candidate> = waiting
                .iter()
                .filter(|(_, lane)| *lane == ClaimLane::Enforced(index))
                .map(|(c, _)| c)
                .collect();
            used[index] = items.len() as i64;
            if free_places[index].is_empty() || items.is_empty() {
                continue;
            }
            let flows: Vec<String> = items.iter().map(|c| c.flow.clone()).collect();
            let places = &free_places[index][..items.len()];
            let name = &enforced.quota.name;
            let leases = lease_places(&mut tx, name, places, &flows).await?;
            for (candidate, place) in items.iter().zip(places) {
                if let Some(lease) = leases.iter().find(|l| l.place == *place) {
                    place_leases.insert(candidate.id, *lease);
                }
            }
        }
        chosen.extend(waiting);
        Ok(LockedClaim {
            _open: open,
            tx,
            claimants: group.claimants,
            chosen,
            place_leases,
            used,
            places_full,
        })
    }

    /// Ends a claim's transaction: leases the chosen items, in rationing
    /// order, to the group's claimants first come first served, each up to
    /// its `max`; of the measured items, only those `granted` (their
    /// decisions' outcome and in-flight place lease), the others left as
    /// they were.
    pub async fn lease_locked(
        &self,
        locked: LockedClaim<'_>,
        granted: &HashMap<i64, MeasuredGrant>,
    ) -> Result<ClaimLeases, sqlx::Error> {
        let LockedClaim {
            _open: open,
            mut tx,
            claimants,
            mut chosen,
            place_leases,
            used,
            places_full,
        } = locked;
        chosen.retain(|(c, lane)| *lane != ClaimLane::Measured || granted.contains_key(&c.id));
        let enforced_leases = place_leases.iter().map(|(id, lease)| (*id, lease.lease_id));
        let measured_leases = granted
            .iter()
            .filter_map(|(id, grant)| Some((*id, grant.lease_id?)));
        let lease_ids: HashMap<i64, i64> = enforced_leases.chain(measured_leases).collect();
        let outcome = |c: &Candidate, lane: ClaimLane| match (lane, granted.get(&c.id)) {
            (ClaimLane::Measured, Some(grant)) => grant.outcome,
            _ => lane.outcome(),
        };
        let items = lease_chosen(&mut tx, chosen, &lease_ids, claimants, outcome).await?;
        tx.commit().await?;
        drop(open);
        Ok(ClaimLeases {
            items,
            place_leases,
            used,
            places_full,
        })
    }
}

/// The flows whose items a claim decides one by one, like reservations
/// (design.md §12): every item of the flows that spend several quotas, and
/// the items with a `spend` of the others.
#[derive(Clone, Copy, Default)]
pub struct MeasuredLanes<'a> {
    pub every_item: &'a [String],
    pub with_spend: &'a [String],
}

/// A measured item's grant: how it was decided, and the in-flight place
/// lease it holds.
#[derive(Clone, Copy, Debug)]
pub struct MeasuredGrant {
    pub outcome: Outcome,
    pub lease_id: Option<i64>,
}

/// A claim's transaction with its items locked and chosen, before its
/// measured items are decided.
pub struct LockedClaim<'a> {
    _open: OwnedSemaphorePermit,
    tx: StoreTransaction,
    claimants: &'a [Claimant],
    chosen: Vec<(Candidate, ClaimLane)>,
    /// In-flight place leases of the chosen enforced items, by item id.
    place_leases: HashMap<i64, PlaceLease>,
    used: Vec<i64>,
    places_full: Option<Deferral>,
}

impl LockedClaim<'_> {
    /// The chosen items to decide one by one, most urgent first.
    pub fn measured(&self) -> impl Iterator<Item = &Candidate> {
        self.chosen
            .iter()
            .filter(|(_, lane)| *lane == ClaimLane::Measured)
            .map(|(c, _)| c)
    }
}

/// Leases the chosen items, in the order they were chosen, to the claimants:
/// first come first served, each up to its `max`; each item with its
/// decision's outcome and its in-flight place lease. Per claimant.
async fn lease_chosen(
    tx: &mut StoreTransaction,
    chosen: Vec<(Candidate, ClaimLane)>,
    lease_ids: &HashMap<i64, i64>,
    claimants: &[Claimant],
    outcome: impl Fn(&Candidate, ClaimLane) -> Outcome,
) -> Result<Vec<Vec<(WorkItem, ClaimLane)>>, sqlx::Error> {
    let mut shares = vec![Vec::new(); claimants.len()];
    if chosen.is_empty() {
        return Ok(shares);
    }
    let maxes: Vec<i64> = claimants.iter().map(|claimant| claimant.max).collect();
    let counts = share_up_to(&maxes, chosen.len() as i64);
    let claimant_of: Vec<usize> = counts
        .iter()
        .enumerate()
        .flat_map(|(claimant, &count)| std::iter::repeat_n(claimant, count as usize))
        .collect();
    let ids: Vec<i64> = chosen.iter().map(|(c, _)| c.id).collect();
    let workers: Vec<String> = claimant_of
        .iter()
        .map(|&h| claimants[h].worker.clone())
        .collect();
    let lease_seconds: Vec<f64> = claimant_of
        .iter()
        .map(|&h| claimants[h].lease_seconds)
        .collect();
    let outcomes: Vec<String> = chosen
        .iter()
        .map(|(c, k)| outcome(c, *k).as_str().to_string())
        .collect();
    let place_lease_ids: Vec<Option<i64>> =
        ids.iter().map(|id| lease_ids.get(id).copied()).collect();
    let leased = lease(
        tx,
        &ids,
        &workers,
        &lease_seconds,
        &outcomes,
        &place_lease_ids,
    );
    let mut leased: HashMap<i64, WorkItem> = leased
        .await?
        .into_iter()
        .map(|item| (item.id, item))
        .collect();
    for ((c, kind), claimant) in chosen.into_iter().zip(claimant_of) {
        if let Some(item) = leased.remove(&c.id) {
            shares[claimant].push((item, kind));
        }
    }
    Ok(shares)
}
