//! Claims from the pending-work registry (global rationing across workers).
//! One transaction per claim. A first look locks the due items (leased as
//! `bypassed`, without a reservation) and the items of never-throttled flows,
//! and finds which enforced flows have work; observed lanes are locked next.
//! Last, each enforced quota with work, in name order (so claims never
//! deadlock on quota rows), locks free in-flight places if it has
//! `max_in_flight`, takes up to `max` slots, which holds its window row until
//! commit, and only then locks that many of its most urgent items: claims of
//! one quota follow the queue order exactly. They also queue on that row, so
//! as little as possible happens between the take and the commit. The
//! candidates of every lane are merged in rationing order, the best `max` are
//! leased, and the slots no leased item needs are given back before commit:
//! slots and claims commit together, and a rollback returns both. Items not
//! leased are never written, so a deferred claim leaves the queue unchanged.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::ToSchema;

use super::batch::with_rule;
use super::observe::{late_would_defers, past_ceiling};
use super::rationing::Ask;
use super::{Arbiter, StoreUnavailable};
use crate::bypass::BypassDesk;
use crate::catalog::{Mode, QuotaRule, Snapshot};
use crate::decision::{Decision, Limit, Outcome, SlotRequest};
use crate::store::slots::{give_back_slots, take_slots};
use crate::store::work::{
    first_look, lease, lease_places, lock_candidates, lock_free_places, Candidate, Lane, PlaceLease,
};
use crate::store::{first_lease_expiry, take_paced, Refusal, Take, WorkItem};

/// Most items one claim may lease.
pub const MAX_CLAIM: i64 = 100;

#[derive(Clone, Debug)]
pub struct ClaimRequest {
    pub worker: String,
    /// Only these flows; `None`: every flow.
    pub flows: Option<Vec<String>>,
    pub max: i64,
    pub lease: Duration,
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
struct Lanes {
    enforced: BTreeMap<String, (QuotaRule, Vec<String>)>,
    observed: BTreeMap<String, (QuotaRule, Vec<String>)>,
    /// Per enforced quota, the ceiling a take may reach: the strictest
    /// headroom share among the lane's flows, so no flow's items go past its
    /// part of the window.
    take_ceilings: BTreeMap<String, i64>,
    /// Every enforced or observed flow: the rest is never throttled.
    throttled_flows: Vec<String>,
}

impl Lanes {
    fn new(snapshot: &Snapshot, worker_flows: Option<&[String]>) -> Self {
        let mut lanes = Lanes {
            enforced: BTreeMap::new(),
            observed: BTreeMap::new(),
            take_ceilings: BTreeMap::new(),
            throttled_flows: Vec::new(),
        };
        for flow in snapshot.flows() {
            let Some(rule) = snapshot.rule(&flow.name) else {
                continue;
            };
            let lane = match rule.flow.mode {
                Mode::Enforce => &mut lanes.enforced,
                Mode::Observe => &mut lanes.observed,
                Mode::Count => continue,
            };
            lanes.throttled_flows.push(flow.name.clone());
            if worker_flows.is_some_and(|wanted| !wanted.contains(&flow.name)) {
                continue;
            }
            let entry = lane
                .entry(rule.quota.name.clone())
                .or_insert_with(|| (rule.quota.clone(), Vec::new()));
            entry.1.push(flow.name.clone());
            if rule.flow.mode == Mode::Enforce {
                let ceiling = rule.quota.ceiling_for(rule.flow.priority);
                lanes
                    .take_ceilings
                    .entry(rule.quota.name.clone())
                    .and_modify(|c| *c = (*c).min(ceiling))
                    .or_insert(ceiling);
            }
        }
        lanes
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Due,
    /// Granted from the take at this index.
    Enforced(usize),
    Observed,
    Unthrottled,
}

impl Kind {
    fn outcome(self) -> Outcome {
        match self {
            Kind::Due => Outcome::Bypassed,
            Kind::Enforced(_) | Kind::Observed => Outcome::Granted,
            Kind::Unthrottled => Outcome::Unthrottled,
        }
    }
}

/// What one enforced quota's lane took for a claim.
struct LaneTake {
    quota: String,
    take: Take,
    /// Quotas with `max_in_flight`: the free in-flight places locked for it.
    free_places: Vec<i32>,
}

struct Leased {
    items: Vec<(WorkItem, Kind)>,
    takes: Vec<LaneTake>,
    /// In-flight place leases of the leased items, by item id.
    place_leases: HashMap<i64, PlaceLease>,
    /// Of the lanes that had work but took nothing, the limit that lifts first.
    lifts_first: Option<Refusal>,
}

impl Arbiter {
    #[tracing::instrument(skip_all, fields(worker = %request.worker, max = request.max))]
    pub async fn claim(
        &self,
        bypass: &BypassDesk,
        request: &ClaimRequest,
    ) -> Result<Claim, StoreUnavailable> {
        // Without the catalog nobody can tell an enforced flow from an
        // unknown one: fail closed.
        let snapshot = self
            .catalog
            .snapshot()
            .ok_or_else(|| StoreUnavailable("catalog not loaded yet".into()))?;
        let lanes = Lanes::new(&snapshot, request.flows.as_deref());
        let horizon = bypass.horizon().num_milliseconds() as f64 / 1000.0;
        let leased = self
            .bounded(
                self.lease_in_one_transaction(&lanes, request, horizon),
                "claim_work",
            )
            .await?;
        if leased.items.is_empty() {
            return self
                .nothing_claimed(request, horizon, leased.lifts_first)
                .await;
        }
        let mut items = Vec::with_capacity(leased.items.len());
        let mut observed: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (item, kind) in leased.items {
            let rule = snapshot.rule(&item.flow);
            let had_deadline = item.deadline.is_some();
            let decision = match (kind, &rule) {
                (Kind::Due, _) => bypass.grant(&SlotRequest {
                    flow: item.flow.clone(),
                    count: 1,
                    deadline: item.deadline,
                    reference: item.reference.clone(),
                }),
                (Kind::Enforced(take), Some(rule)) => {
                    let mut decision = with_rule(rule);
                    decision.window_start = Some(leased.takes[take].take.clock.window_start);
                    if let Some(place) = leased.place_leases.get(&item.id) {
                        decision.lease_id = Some(place.lease_id);
                        decision.valid_until = Some(place.valid_until);
                    }
                    self.settle(decision, had_deadline, true)
                }
                (Kind::Observed, Some(rule)) => {
                    observed
                        .entry(rule.quota.name.clone())
                        .or_default()
                        .push(items.len());
                    with_rule(rule) // settled below, once its slot is spent
                }
                (_, Some(rule)) if rule.flow.mode == Mode::Count => {
                    let decision = self.count_after_the_fact(with_rule(rule), rule, 1);
                    self.settle(decision, had_deadline, true)
                }
                _ => self.settle(
                    Decision::new(Outcome::Unthrottled, &item.flow),
                    had_deadline,
                    false,
                ),
            };
            items.push(ClaimedItem { item, decision });
        }
        for (quota, indices) in observed {
            self.spend_observed_claims(&snapshot, &quota, &mut items, &indices)
                .await;
        }
        Ok(Claim {
            outcome: ClaimOutcome::Claimed,
            items,
            retry_at: None,
            retry_after_seconds: None,
            limit: None,
        })
    }

    async fn lease_in_one_transaction(
        &self,
        lanes: &Lanes,
        request: &ClaimRequest,
        horizon_seconds: f64,
    ) -> Result<Leased, sqlx::Error> {
        let mut tx = self.store.pool().begin().await?;
        let lane = |flows| Lane {
            flows,
            worker_flows: request.flows.as_deref(),
            horizon_seconds,
        };
        let enforced: Vec<String> = lanes
            .enforced
            .values()
            .flat_map(|(_, f)| f.clone())
            .collect();
        let look = first_look(
            &mut tx,
            request.flows.as_deref(),
            horizon_seconds,
            request.max,
            &lanes.throttled_flows,
            &enforced,
        )
        .await?;
        let mut chosen: Vec<(Candidate, Kind)> =
            look.due.into_iter().map(|c| (c, Kind::Due)).collect();
        chosen.sort_by_key(|(c, _)| c.rank());
        let remaining = request.max - chosen.len() as i64;
        let mut takes = Vec::new();
        let mut lifts_first = None;
        let mut waiting: Vec<(Candidate, Kind)> = Vec::new();
        if remaining > 0 {
            // Lanes that need no slot go first: a claim then holds a quota's
            // window row only for its take, its lane and the lease.
            waiting.extend(look.unthrottled.into_iter().map(|c| (c, Kind::Unthrottled)));
            for (_, flows) in lanes.observed.values() {
                let found = lock_candidates(&mut tx, &lane(flows), remaining).await?;
                waiting.extend(found.into_iter().map(|c| (c, Kind::Observed)));
            }
            let busy = look.busy;
            for (name, (quota, flows)) in &lanes.enforced {
                let ceiling = lanes.take_ceilings[name];
                if ceiling < 1 || !flows.iter().any(|f| busy.contains(f)) {
                    // The guard: a ceiling below 1 grants nothing.
                    continue;
                }
                let (took, stopped_by) = take_for_lane(&mut tx, quota, remaining, ceiling).await?;
                lifts_first = earliest(lifts_first, stopped_by);
                let Some(took) = took else {
                    continue;
                };
                let lane = lane(flows);
                let kind = Kind::Enforced(takes.len());
                let found = lock_candidates(&mut tx, &lane, took.take.taken).await?;
                takes.push(took);
                waiting.extend(found.into_iter().map(|c| (c, kind)));
            }
        }
        waiting.sort_by_key(|(c, _)| c.rank());
        waiting.truncate(remaining.max(0) as usize);
        let place_leases = settle_takes(&mut tx, &takes, &waiting).await?;
        chosen.extend(waiting);
        let (worker, lease_seconds) = (&request.worker, request.lease.as_secs_f64());
        let items = lease_chosen(&mut tx, chosen, &place_leases, worker, lease_seconds).await?;
        tx.commit().await?;
        Ok(Leased {
            items,
            takes,
            place_leases,
            lifts_first,
        })
    }

    /// Observed items are granted regardless; their quota's slots are spent
    /// after the claim commits, in one statement per quota, and each item
    /// says whether enforcement would have deferred it.
    async fn spend_observed_claims(
        &self,
        snapshot: &Snapshot,
        quota: &str,
        items: &mut [ClaimedItem],
        indices: &[usize],
    ) {
        let Some(rule) = snapshot.rule(&items[indices[0]].item.flow) else {
            return;
        };
        let asked: Vec<(String, bool)> = indices
            .iter()
            .map(|&i| (items[i].item.flow.clone(), items[i].item.deadline.is_some()))
            .collect();
        let asks: Vec<Ask> = asked
            .iter()
            .map(|(flow, _)| {
                let priority = snapshot.rule(flow).map_or(1, |r| r.flow.priority);
                Ask::observed(1, rule.quota.ceiling_for(priority))
            })
            .collect();
        let late = || late_would_defers(quota.to_string(), asked, asks.clone());
        let total = indices.len() as i64;
        let reservation = self.spend_observed(&rule, total, late).await;
        let past = reservation
            .as_ref()
            .and_then(|r| r.count_after)
            .map(|after| past_ceiling(after, &asks));
        for (k, &i) in indices.iter().enumerate() {
            let decision = &mut items[i].decision;
            if let Some(reservation) = &reservation {
                decision.window_start = Some(reservation.clock.window_start);
            }
            decision.would_defer = past.as_ref().is_some_and(|p| p[k]);
            decision.limit = decision.would_defer.then_some(Limit::Budget);
            let had_deadline = items[i].item.deadline.is_some();
            *decision = self.settle(decision.clone(), had_deadline, true);
        }
    }

    /// Deferred (work is waiting: retry at the next window, when an item
    /// enters the bypass horizon, when a cadence or concurrency limit lifts,
    /// or when an item's retry delay ends, whichever is soonest) or empty.
    async fn nothing_claimed(
        &self,
        request: &ClaimRequest,
        horizon_seconds: f64,
        lifts_first: Option<Refusal>,
    ) -> Result<Claim, StoreUnavailable> {
        let backlog = self
            .bounded(
                self.store
                    .backlog(request.flows.as_deref(), horizon_seconds),
                "work_backlog",
            )
            .await?;
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

/// Takes up to `want` slots for one enforced quota's lane (no more than its
/// free in-flight places, locked first: the lock order of a single
/// reservation). Also answers what stopped it if nothing was taken.
async fn take_for_lane(
    tx: &mut PgConnection,
    quota: &QuotaRule,
    want: i64,
    ceiling: i64,
) -> Result<(Option<LaneTake>, Option<Refusal>), sqlx::Error> {
    let name = &quota.name;
    let free_places = match quota.max_in_flight {
        Some(_) => lock_free_places(&mut *tx, name, want).await?,
        None => Vec::new(),
    };
    let want = match quota.max_in_flight {
        Some(_) => free_places.len() as i64,
        None => want,
    };
    if want == 0 {
        let (_, expiry) = first_lease_expiry(&mut *tx, name).await?;
        let full = Refusal {
            limit: Limit::InFlight,
            retry_at: expiry,
        };
        return Ok((None, Some(full)));
    }
    let take = match quota.cadence {
        None => take_slots(&mut *tx, name, want, ceiling).await?,
        // Cadence tokens and budget slots together, one at a time.
        Some(_) => take_paced(tx, quota, want, ceiling).await?,
    };
    let stopped_by = if take.taken == 0 {
        take.stopped_by
    } else {
        None
    };
    let took = LaneTake {
        quota: name.clone(),
        take,
        free_places,
    };
    Ok((Some(took), stopped_by))
}

/// Leases the chosen items to `worker`, each with its decision's outcome and
/// its in-flight place lease; in the order they were chosen.
async fn lease_chosen(
    tx: &mut PgConnection,
    chosen: Vec<(Candidate, Kind)>,
    place_leases: &HashMap<i64, PlaceLease>,
    worker: &str,
    lease_seconds: f64,
) -> Result<Vec<(WorkItem, Kind)>, sqlx::Error> {
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = chosen.iter().map(|(c, _)| c.id).collect();
    let outcomes: Vec<String> = chosen
        .iter()
        .map(|(_, k)| k.outcome().as_str().to_string())
        .collect();
    let place_lease_ids: Vec<Option<i64>> = ids
        .iter()
        .map(|id| place_leases.get(id).map(|l| l.lease_id))
        .collect();
    let leased = lease(
        &mut *tx,
        &ids,
        &outcomes,
        &place_lease_ids,
        worker,
        lease_seconds,
    );
    let mut leased: HashMap<i64, WorkItem> = leased
        .await?
        .into_iter()
        .map(|item| (item.id, item))
        .collect();
    Ok(chosen
        .into_iter()
        .filter_map(|(c, kind)| leased.remove(&c.id).map(|item| (item, kind)))
        .collect())
}

/// Once the best candidates are chosen: each lane gives back the slots none
/// of its items use and leases an in-flight place to each item that has one.
async fn settle_takes(
    tx: &mut PgConnection,
    takes: &[LaneTake],
    chosen: &[(Candidate, Kind)],
) -> Result<HashMap<i64, PlaceLease>, sqlx::Error> {
    let mut place_leases = HashMap::new();
    for (index, lane) in takes.iter().enumerate() {
        let used: Vec<&Candidate> = chosen
            .iter()
            .filter(|(_, k)| matches!(k, Kind::Enforced(i) if *i == index))
            .map(|(c, _)| c)
            .collect();
        let unused = lane.take.taken - used.len() as i64;
        if unused > 0 {
            let window = lane.take.clock.window_start;
            give_back_slots(&mut *tx, &lane.quota, window, unused).await?;
        }
        if lane.free_places.is_empty() || used.is_empty() {
            continue;
        }
        let flows: Vec<String> = used.iter().map(|c| c.flow.clone()).collect();
        let places = &lane.free_places[..used.len()];
        let leases = lease_places(&mut *tx, &lane.quota, places, &flows).await?;
        for (candidate, place) in used.iter().zip(places) {
            if let Some(lease) = leases.iter().find(|l| l.place == *place) {
                place_leases.insert(candidate.id, *lease);
            }
        }
    }
    Ok(place_leases)
}

/// The refusal that lifts first.
fn earliest(a: Option<Refusal>, b: Option<Refusal>) -> Option<Refusal> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.retry_at < a.retry_at { b } else { a }),
        (a, b) => a.or(b),
    }
}
