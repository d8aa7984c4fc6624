//! Claims from the pending-work registry (global rationing across workers).
//! Concurrent claims of the same flows are leased as one group
//! (`claim_groups.rs`); for a group, first a look that locks nothing says
//! which enforced lanes have work; each of those quotas then takes up to
//! the group's `max` slots in a statement of its own, in name order, so a
//! claim holds a quota's window row for that statement only and claims of
//! one quota no longer queue behind each other's transaction. One
//! transaction, begun while the takes run (its first look needs no slot),
//! locks the due items (leased as `bypassed`, without a
//! reservation), the items of never-throttled and observed flows, and for
//! each enforced lane as many of its most urgent items as it took slots (and
//! has free in-flight places); the best in rationing order are leased, to
//! the group's claims first come first served. The slots no leased item uses
//! go back right after; if the group fails or stops first, all of them go
//! back (an over-count in between, never an under-count). Items not leased
//! are never written, so a deferred claim leaves the queue unchanged. Each
//! claim then decides its own items' answers.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::WorkRegistry;
use crate::bypass::BypassDesk;
use crate::domain::catalog::Handling;
use crate::domain::catalog::{Mode, QuotaRule, Rule, Snapshot};
use crate::domain::decision::{Decision, Deferral, Limit, Outcome, SlotRequest};
use crate::domain::window::Period;
use crate::domain::FlowName;
use crate::reservations::with_rule;
use crate::shell::all_at_once;
use crate::shell::{Operation, Shell};
use crate::store::claim::{
    ClaimGroup, ClaimLane, ClaimLeases, Claimant, EnforcedLane, LockedClaim, MeasuredGrant,
    MeasuredLanes,
};
use crate::store::work::Candidate;
use crate::store::StoreError;
use crate::store::{Store, Take, WorkItem};

/// Most items one claim may lease.
pub const MAX_CLAIM: i64 = 100;

#[derive(Clone, Debug)]
pub struct ClaimRequest {
    pub worker: String,
    /// Only these flows; `None`: every flow.
    pub flows: Option<Vec<FlowName>>,
    pub max: i64,
    pub lease: Duration,
    /// The API key claiming: the one that may settle what its items'
    /// decisions reserved (design.md §12).
    pub key_id: Option<i64>,
}

impl ClaimRequest {
    /// The flows as the store's statements take them (text).
    pub(super) fn flow_names(&self) -> Option<Vec<String>> {
        let flows = self.flows.as_ref()?;
        Some(flows.iter().map(FlowName::to_string).collect())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClaimOutcome {
    /// At least one item was leased.
    Claimed,
    /// Claimable work is waiting but none of it can be granted now: retry at `retry_at`.
    Deferred,
    /// Nothing claimable for these flows.
    Empty,
}

/// A leased item and the decision that granted it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimedItem {
    pub item: WorkItem,
    pub decision: Decision,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Claim {
    pub outcome: ClaimOutcome,
    /// Leased items, most urgent first.
    pub items: Vec<ClaimedItem>,
    /// Deferred only: the earliest time something could be granted.
    pub retry_at: Option<DateTime<Utc>>,
    pub retry_after_seconds: Option<i64>,
    /// Deferred only: the limit holding the work back (the one that lifts
    /// first): budget, cadence or in_flight; `null` when the work only waits
    /// out the retry delay its release asked for.
    pub limit: Option<Limit>,
}

/// The flows of the catalog the worker asked for, by how they spend a quota.
pub(crate) struct Lanes {
    enforced: BTreeMap<String, (QuotaRule, Vec<String>)>,
    observed: BTreeMap<String, (QuotaRule, Vec<String>)>,
    /// Per enforced quota, the ceiling a take may reach: the strictest
    /// headroom share among the lane's flows, so no flow's items go past its
    /// part of the window.
    take_shares: BTreeMap<String, Option<i16>>,
    /// Enforced and observed flows that spend several quotas: each of their
    /// items is decided on its own, like a reservation.
    every_item_measured: Vec<String>,
    /// The other enforced and observed flows: their items with a `spend`
    /// are decided so too.
    spend_measured: Vec<String>,
}

impl Lanes {
    /// `stale`: the catalog was not reloaded within its bound and may be
    /// obeying a flag changed since, so enforced flows get no lane (their
    /// items wait, fail closed) while the others are claimed as ever.
    pub(super) fn new(snapshot: &Snapshot, worker_flows: Option<&[String]>, stale: bool) -> Self {
        let mut lanes = Lanes {
            enforced: BTreeMap::new(),
            observed: BTreeMap::new(),
            take_shares: BTreeMap::new(),
            every_item_measured: Vec::new(),
            spend_measured: Vec::new(),
        };
        // The worker's flows (each once), or every flow of the catalog.
        let names: BTreeSet<&str> = match worker_flows {
            Some(wanted) => wanted.iter().map(String::as_str).collect(),
            None => snapshot.flows().map(|flow| flow.name.as_str()).collect(),
        };
        for name in names {
            // Count-mode flows are never throttled and unknown ones hold no
            // work to ration: neither has a lane.
            let (lane, rule) = match Handling::of(Some(snapshot), name) {
                Handling::Enforce(_) if stale => continue,
                Handling::Enforce(rule) => (&mut lanes.enforced, rule),
                Handling::Observe(rule) => (&mut lanes.observed, rule),
                Handling::Count(_) | Handling::Unknown | Handling::CatalogNotLoaded => continue,
            };
            // An item of a flow that spends several quotas is decided on
            // its own, all or nothing across them: no lane's slots of one
            // quota can grant it.
            if rule.spends_several() {
                lanes.every_item_measured.push(name.to_string());
                continue;
            }
            lanes.spend_measured.push(name.to_string());
            let entry = lane
                .entry(rule.quota.name.clone())
                .or_insert_with(|| (rule.quota.clone(), Vec::new()));
            entry.1.push(name.to_string());
            if rule.flow.mode == Mode::Enforce {
                let share = rule.quota.share_for(rule.flow.priority);
                lanes
                    .take_shares
                    .entry(rule.quota.name.clone())
                    .and_modify(|s| *s = narrowest(*s, share))
                    .or_insert(share);
            }
        }
        lanes
    }
}

/// The narrower of two shares of a window (`None`: all of it).
fn narrowest(a: Option<i16>, b: Option<i16>) -> Option<i16> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The slots a claim took, until its items are leased: whatever no leased
/// item uses goes back, and all of them if the claim fails or is dropped.
struct HeldTakes {
    store: Store,
    /// Emptied once settled: what is left when it drops goes back whole.
    takes: Vec<(String, Take)>,
}

impl HeldTakes {
    fn new(store: Store) -> Self {
        Self {
            store,
            takes: Vec::new(),
        }
    }

    /// Gives back what the leased items do not use (`used[i]` of take i).
    async fn settle(mut self, used: &[i64]) {
        let unused: Vec<(String, Take, i64)> = std::mem::take(&mut self.takes)
            .into_iter()
            .zip(used)
            .map(|((quota, take), used)| {
                let unused = take.taken - used;
                (quota, take, unused)
            })
            .collect();
        give_back(self.store.clone(), unused).await;
    }
}

impl Drop for HeldTakes {
    fn drop(&mut self) {
        if self.takes.is_empty() {
            return;
        }
        let all = std::mem::take(&mut self.takes)
            .into_iter()
            .map(|(quota, take)| {
                let taken = take.taken;
                (quota, take, taken)
            })
            .collect();
        tokio::spawn(give_back(self.store.clone(), all));
    }
}

/// Slots taken that no leased item uses.
async fn give_back(store: Store, unused: Vec<(String, Take, i64)>) {
    for (quota, take, slots) in unused {
        store.give_back_unused(&quota, &take.windows, slots).await;
    }
}

/// Enforced lanes (by quota) whose last group used every slot it took:
/// their queue most likely holds more, so the next group takes for them
/// without looking first (docs/design.md §9). A lane never seen, or whose
/// last group left slots unused (its queue ran dry), is looked at first.
/// Only a hint: a take for a lane with nothing to claim gives its slots back
/// before anyone is answered.
#[derive(Clone, Default)]
pub(crate) struct BusyLanes(Arc<Mutex<HashSet<String>>>);

impl BusyLanes {
    fn known<'a>(&self, lanes: &'a Lanes) -> BTreeSet<&'a str> {
        let busy = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let names = lanes.enforced.keys().map(String::as_str);
        names.filter(|name| busy.contains(*name)).collect()
    }

    fn record(&self, quota: &str, busy: bool) {
        let mut lanes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if busy {
            lanes.insert(quota.to_string());
        } else {
            lanes.remove(quota);
        }
    }
}

/// What a group of claims leased, with the takes its enforced items were
/// granted from.
pub(crate) struct Leased {
    pub leases: ClaimLeases,
    pub takes: Vec<Take>,
    /// The decisions of the measured items, by item id.
    pub measured: HashMap<i64, Decision>,
    /// Of the lanes whose take stopped short, the limit that lifts first.
    pub lifts_first: Option<Deferral>,
}

impl WorkRegistry {
    // Debug level, as `decide`: a span per claim is paid for (an entry in the
    // span registry, its fields formatted as JSON) whether or not anything is
    // logged in it.
    #[tracing::instrument(level = "debug", skip_all, fields(worker = %request.worker, max = request.max))]
    pub async fn claim(
        &self,
        bypass: &BypassDesk,
        request: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        // Without the catalog nobody can tell an enforced flow from an
        // unknown one: fail closed.
        let snapshot = self.catalog.loaded()?;
        let horizon = bypass.horizon_seconds();
        let mut share = self.claim_together(snapshot, request, horizon).await?;
        if share.items.is_empty() {
            return self
                .nothing_claimed(request, horizon, share.lifts_first)
                .await;
        }
        let snapshot = &share.snapshot.clone();
        let request_key = request.key_id;
        let mut items = Vec::with_capacity(share.items.len());
        let mut observed: Vec<(usize, Rule)> = Vec::new();
        for (item, kind) in share.items {
            let rule = snapshot.rule(&item.flow);
            let had_deadline = item.deadline.is_some();
            let decision = match (kind, &rule) {
                (ClaimLane::Due, _) => bypass.grant(&one_slot_of(&item)),
                (ClaimLane::Enforced(take), Some(rule)) => {
                    let taken = &share.takes[take];
                    let mut decision =
                        with_rule(rule).counted_in(&taken.windows, None, &taken.clock);
                    if let Some(place) = share.place_leases.get(&item.id) {
                        decision.lease_id = Some(place.lease_id);
                        decision.valid_until = Some(place.valid_until);
                    }
                    self.reservations.record(decision, had_deadline, true)
                }
                (ClaimLane::Observed, Some(rule)) => {
                    observed.push((items.len(), rule.clone()));
                    with_rule(rule) // decided below, once the claim committed
                }
                // Decided (and recorded) on its own, before it was leased.
                // A grant of an item with a `spend` is recorded to be
                // settled, by the key that claimed it.
                (ClaimLane::Measured, _) => match share.measured.remove(&item.id) {
                    Some(mut decision) => {
                        let request = one_slot_of(&item);
                        self.reservations
                            .open_settlement(&mut decision, &request, request_key)
                            .await;
                        decision
                    }
                    None => continue,
                },
                // A count-mode flow (or one the catalog has since moved):
                // spent without a reservation, counted after the fact.
                (ClaimLane::Unthrottled, Some(rule)) => {
                    let amounts = one_slot_of(&item).amounts(rule);
                    let decision =
                        self.reservations
                            .count_after_the_fact(with_rule(rule), rule, &amounts);
                    self.reservations.record(decision, had_deadline, true)
                }
                _ => self.reservations.record(
                    Decision::new(Outcome::Unthrottled, &item.flow),
                    had_deadline,
                    false,
                ),
            };
            items.push(ClaimedItem { item, decision });
        }
        self.observe_claimed(&mut items, &observed).await;
        Ok(Claim {
            outcome: ClaimOutcome::Claimed,
            items,
            retry_at: None,
            retry_after_seconds: None,
            limit: None,
        })
    }

    /// For a group of claims of the same flows: takes the slots of each
    /// enforced lane with work (a look says which, for the lanes not known
    /// busy), each in a statement of its own, while the transaction begins
    /// with its first look; then leases items in that transaction, then
    /// gives back the slots no leased item uses; all within one time budget.
    pub(super) async fn lease_items(
        &self,
        lanes: &Lanes,
        group: ClaimGroup<'_>,
    ) -> Result<Leased, StoreError> {
        let shell = self.shell.one_budget();
        let known_busy = self.busy_lanes.known(lanes);
        let enforced_flows: Vec<String> = lanes
            .enforced
            .iter()
            .filter(|(name, _)| !known_busy.contains(name.as_str()))
            .flat_map(|(_, (_, f))| f.clone())
            .collect();
        let looked_busy = if enforced_flows.is_empty() {
            Vec::new()
        } else {
            let look =
                self.store
                    .busy_flows(group.worker_flows, group.horizon_seconds, &enforced_flows);
            shell.run(Operation::ClaimWork, look).await?
        };
        let busy = |name: &str, flows: &[String]| {
            known_busy.contains(name) || flows.iter().any(|f| looked_busy.contains(f))
        };
        // The transaction's first look needs no slot: it runs while the
        // lanes take theirs, on a connection of its own.
        let begin = self.store.begin_claim(group);
        let wanted = Claimant::most_items(group.claimants);
        let (begun, taken) = tokio::join!(
            shell.run(Operation::ClaimWork, begin),
            self.take_for_lanes(&shell, lanes, busy, wanted),
        );
        let (held, enforced, lifts_first) = taken?;
        let begun = begun?;
        self.metrics.record_claim_wait(begun.waited);
        let observed: Vec<&[String]> = lanes.observed.values().map(|(_, f)| f.as_slice()).collect();
        let measured = MeasuredLanes {
            every_item: &lanes.every_item_measured,
            with_spend: &lanes.spend_measured,
        };
        let lock = self.store.lock_claim(begun, &observed, &enforced, measured);
        let locked = shell.run(Operation::ClaimWork, lock).await?;
        let (grants, measured, refused) = self.decide_measured(&locked).await?;
        let lease = self.store.lease_locked(locked, &grants);
        let leases = shell.run(Operation::ClaimWork, lease).await?;
        let takes: Vec<Take> = held.takes.iter().map(|(_, take)| take.clone()).collect();
        for ((name, take), used) in held.takes.iter().zip(&leases.used) {
            self.busy_lanes.record(name, *used == take.taken);
        }
        held.settle(&leases.used).await;
        let lifts_first = earliest(earliest(lifts_first, leases.places_full), refused);
        Ok(Leased {
            leases,
            takes,
            measured,
            lifts_first,
        })
    }

    /// Decides the measured items a claim locked, each as a reservation of
    /// what it spends would be (`Reservations::decide`: all or nothing
    /// across every window of every quota, coalesced with every concurrent
    /// call, observe mode and gradual rollout included), all at once so that
    /// they are decided together in rationing order. Answers the grants (to
    /// lease), every decision by item id, and of the refusals the one that
    /// lifts first. A grant whose item is then not leased (the
    /// transaction failed) stays spent: an over-count, never an under-count.
    async fn decide_measured(
        &self,
        locked: &LockedClaim<'_>,
    ) -> Result<
        (
            HashMap<i64, MeasuredGrant>,
            HashMap<i64, Decision>,
            Option<Deferral>,
        ),
        StoreError,
    > {
        let items: Vec<(i64, SlotRequest)> = locked
            .measured()
            .map(|candidate| (candidate.id, request_of(candidate)))
            .collect();
        let decided = all_at_once(
            items
                .iter()
                .map(|(_, request)| self.reservations.decide(request)),
        )
        .await;
        let (mut grants, mut decisions, mut refused) = (HashMap::new(), HashMap::new(), None);
        for ((id, _), decision) in items.iter().zip(decided) {
            let decision = decision?;
            match decision.outcome {
                Outcome::Deferred => refused = earliest(refused, deferral_of(&decision)),
                outcome => {
                    let lease_id = decision.lease_id;
                    grants.insert(*id, MeasuredGrant { outcome, lease_id });
                }
            }
            decisions.insert(*id, decision);
        }
        Ok((grants, decisions, refused))
    }

    /// Up to `wanted` slots for each enforced lane of `lanes` that is
    /// `busy`, each in a statement of its own: the slots held until the
    /// items are leased, the lanes that took any, and of the takes that
    /// stopped short, the limit that lifts first.
    async fn take_for_lanes<'a>(
        &self,
        shell: &Shell,
        lanes: &'a Lanes,
        busy: impl Fn(&str, &[String]) -> bool,
        wanted: i64,
    ) -> Result<(HeldTakes, Vec<EnforcedLane<'a>>, Option<Deferral>), StoreError> {
        let mut held = HeldTakes::new(self.store.clone());
        let mut enforced = Vec::new();
        let mut lifts_first = None;
        for (name, (quota, flows)) in &lanes.enforced {
            let share = lanes.take_shares[name];
            if !busy(name, flows) {
                continue;
            }
            // A window whose ceiling is below 1 for the lane takes nothing:
            // the take computes every window's room before it writes.
            let take = self.take_for_claim(shell, quota, wanted, share).await?;
            // A take stopped short says when more could come, for the
            // claims of the group that get nothing.
            lifts_first = earliest(lifts_first, take.stopped_by);
            if take.taken == 0 {
                continue;
            }
            enforced.push(EnforcedLane {
                quota,
                flows,
                slots: take.taken,
            });
            held.takes.push((name.clone(), take));
        }
        Ok((held, enforced, lifts_first))
    }

    /// Observed items are granted regardless; their slots are spent after
    /// the claim commits, each as a single observed decision, all at once
    /// and first asked in lease order (most urgent first), so that the
    /// coalescer spends them together and each says whether enforcement
    /// would have deferred it.
    async fn observe_claimed(&self, items: &mut [ClaimedItem], observed: &[(usize, Rule)]) {
        let requests: Vec<SlotRequest> = observed
            .iter()
            .map(|(i, _)| one_slot_of(&items[*i].item))
            .collect();
        let decided = all_at_once(observed.iter().zip(&requests).map(|((i, rule), request)| {
            self.reservations
                .observe(items[*i].decision.clone(), rule, request)
        }))
        .await;
        for (((i, _), request), decision) in observed.iter().zip(&requests).zip(decided) {
            items[*i].decision =
                self.reservations
                    .record(decision, request.deadline.is_some(), true);
        }
    }

    /// Deferred (work is waiting: retry at the next window, when an item
    /// enters the bypass horizon, when a cadence or concurrency limit lifts,
    /// or when an item's retry delay ends, whichever is soonest) or empty.
    async fn nothing_claimed(
        &self,
        request: &ClaimRequest,
        horizon_seconds: f64,
        lifts_first: Option<Deferral>,
    ) -> Result<Claim, StoreError> {
        let flows = request.flow_names();
        let backlog = self.store.backlog(flows.as_deref(), horizon_seconds);
        let backlog = self.shell.run(Operation::WorkBacklog, backlog).await?;
        if backlog.pending == 0 {
            return Ok(Claim {
                outcome: ClaimOutcome::Empty,
                items: Vec::new(),
                retry_at: None,
                retry_after_seconds: None,
                limit: None,
            });
        }
        // What holds back the items claimable now, and when it lifts. An
        // item entering the bypass horizon waits on the budget till then.
        let held = (backlog.claimable > 0).then(|| match lifts_first {
            Some(r) => (r.retry_at.min(backlog.retry_at), r.limit),
            None => (backlog.retry_at, Limit::Budget),
        });
        // Items waiting out a retry delay are held back by nothing else
        // until it ends (with none claimable now, one is waiting): no limit
        // then, if that comes first.
        let (retry_at, limit) = match (held, backlog.next_not_before) {
            (Some((at, limit)), next) if next.is_none_or(|n| at <= n) => (at, Some(limit)),
            (_, next) => (next.unwrap_or(backlog.retry_at), None),
        };
        let retry_at = retry_at.max(backlog.db_now);
        let waited = Decision::new(Outcome::Deferred, "").deferred_until(retry_at, backlog.db_now);
        Ok(Claim {
            outcome: ClaimOutcome::Deferred,
            items: Vec::new(),
            retry_at: waited.retry_at,
            retry_after_seconds: waited.retry_after_seconds,
            limit,
        })
    }
}

/// What claiming an item asks of its flow's quotas: one of each, or what
/// its `spend` names (an estimate to settle, as a reservation's).
fn request_for(
    flow: &str,
    deadline: Option<DateTime<Utc>>,
    reference: Option<&String>,
    spend: Option<&serde_json::Value>,
) -> SlotRequest {
    let spend: BTreeMap<String, i64> = spend
        .and_then(|spend| serde_json::from_value(spend.clone()).ok())
        .unwrap_or_default();
    SlotRequest {
        flow: FlowName::of_row(flow.to_string()),
        count: 1,
        deadline,
        reference: reference.cloned(),
        settle: !spend.is_empty(),
        spend,
    }
}

/// What claiming a leased `item` asks.
fn one_slot_of(item: &WorkItem) -> SlotRequest {
    let (deadline, reference) = (item.deadline, item.reference.as_ref());
    request_for(&item.flow, deadline, reference, item.spend.as_ref())
}

/// What claiming a locked `candidate` asks.
fn request_of(candidate: &Candidate) -> SlotRequest {
    let (deadline, reference) = (candidate.deadline, candidate.reference.as_ref());
    request_for(
        &candidate.flow,
        deadline,
        reference,
        candidate.spend.as_ref(),
    )
}

/// The refusal a deferred decision names, as the claim's `lifts_first`.
fn deferral_of(decision: &Decision) -> Option<Deferral> {
    Some(Deferral {
        limit: decision.limit?,
        retry_at: decision.retry_at?,
        period: decision
            .period
            .as_deref()
            .and_then(|p| Period::parse(p).ok()),
    })
}

/// The refusal that lifts first.
fn earliest(a: Option<Deferral>, b: Option<Deferral>) -> Option<Deferral> {
    a.into_iter()
        .chain(b)
        .min_by_key(|refusal| refusal.retry_at)
}
