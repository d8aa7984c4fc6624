//! Coalescing (design.md §8). Every decision on one quota contends for one row,
//! so a statement per request tops out at the database's hot-row rate.
//! Concurrent enforced decisions for the same quota in this replica are
//! gathered instead: one take-up-to-k upsert decides the whole group, and the
//! slots are shared out in rationing order (deadline, then flow priority, then
//! arrival), each request all or nothing. Still exact: the statement never
//! takes past the ceiling, and slots no request could use (or whose caller
//! stopped waiting) are given back; a failed give-back leaves an over-count,
//! never an under-count. Observed decisions (new flows start in observe mode,
//! so they carry full traffic) are grouped the same way: one statement spends
//! the group's slots and each learns whether enforcement would have refused it.
//!
//! Paced quotas (a cadence, in-flight places or both) are grouped too, across
//! quotas as well: their statement also takes each quota's cadence tokens and
//! in-flight places, and the give-back returns unused tokens and frees unused
//! places with the slots.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::domain::catalog::{QuotaRule, Rule};
use crate::domain::decision::{Deferral, Limit};
use crate::domain::rationing::{self, Ask, Rank, Taken};
use crate::domain::window::{self, Period, Reopening, WindowCount};
use crate::shell::gather::{fail_all, Gather, Reply};
use crate::store::{
    LabelledLease, Lease, PacedAsks, PacedGiveBack, PacedTake, QuotaAsk, QuotaTake, Reservation,
    SeveralAsk, Store,
};
use crate::store::{StoreError, StoreUnavailable};

struct Waiter {
    /// Its `ceiling` is filled in once the take says what the quota's
    /// windows have left (rationing sees one count: what the group spent).
    ask: Ask,
    /// The share of each window's ceiling its flow's priority may reach.
    share: Option<i16>,
    /// The flow asking: the holder of the place it is granted.
    flow: String,
    /// The quota it asks of, as this request saw its limits: a quota's part
    /// of a group is decided by its latest arrival's.
    quota: QuotaRule,
    /// When it joined, among every decision of this replica.
    arrival: u64,
    /// A call that spends several quotas (design.md §12): every quota of
    /// its flow, in order, with what it spends there and the share of each
    /// window its priority may reach; empty for a call of one quota.
    several: Vec<(QuotaRule, i64, Option<i16>)>,
    reply: Reply<Reservation>,
}

/// Enforced decisions are rationed; observed ones are spent regardless, in
/// arrival order, each told whether enforcement would have refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Enforcement {
    Enforce,
    Observe,
}

/// Which statement decides a queue's groups, whatever quotas they ask of:
/// one that takes window slots only, one that also takes cadence tokens
/// and in-flight places, or one that decides calls spending several quotas
/// each, every one all or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    BudgetOnly,
    Paced,
    Several,
}

/// Six queues, by kind of statement and mode; each group goes across
/// quotas.
type Queues = Gather<(Kind, Enforcement), (), Waiter>;

#[derive(Clone)]
pub(crate) struct Coalescer {
    store: Store,
    queues: Queues,
    arrivals: Arc<AtomicU64>,
}

impl Coalescer {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            queues: Gather::default(),
            arrivals: Arc::default(),
        }
    }

    /// Reserves `amounts` of `rule`'s quotas (in its order; with a quota's
    /// tokens and an in-flight place, if it has them) together with whoever
    /// else is asking now.
    pub(crate) async fn reserve(
        &self,
        rule: &Rule,
        amounts: &[i64],
        deadline: Option<DateTime<Utc>>,
    ) -> Result<Reservation, StoreError> {
        let priority = rule.flow.priority;
        let arrival = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let ask = Ask {
            slots: amounts.first().copied().unwrap_or(1),
            ceiling: i64::MAX,
            needs_place: rule.quota.max_in_flight.is_some(),
            rank: Rank::new(deadline, priority, arrival),
        };
        self.join(rule, Enforcement::Enforce, ask, amounts, arrival)
            .await
    }

    /// Spends `amounts` of `rule`'s quotas regardless, together with
    /// whoever else is observing now; the refusal says what enforcement
    /// would have done. Observed decisions take no in-flight place.
    pub(crate) async fn observe(
        &self,
        rule: &Rule,
        amounts: &[i64],
    ) -> Result<Reservation, StoreError> {
        let arrival = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let ask = Ask::observed(amounts.first().copied().unwrap_or(1), i64::MAX);
        self.join(rule, Enforcement::Observe, ask, amounts, arrival)
            .await
    }

    async fn join(
        &self,
        rule: &Rule,
        mode: Enforcement,
        ask: Ask,
        amounts: &[i64],
        arrival: u64,
    ) -> Result<Reservation, StoreError> {
        let priority = rule.flow.priority;
        let several = if rule.spends_several() {
            let quotas = rule.quotas().zip(amounts);
            let spend = |(quota, &amount): (&QuotaRule, &i64)| {
                (quota.clone(), amount, quota.share_for(priority))
            };
            quotas.map(spend).collect()
        } else {
            Vec::new()
        };
        let waiter = |reply| Waiter {
            ask,
            share: rule.quota.share_for(priority),
            flow: rule.flow.name.clone(),
            quota: rule.quota.clone(),
            arrival,
            several,
            reply,
        };
        // Observed decisions take no in-flight place: only a cadence makes
        // theirs a paced statement. A call of several quotas is decided by
        // their windows (the catalog keeps paced quotas out of such flows).
        let budget_only = match mode {
            Enforcement::Enforce => rule.quota.decided_by_window_alone(),
            Enforcement::Observe => rule.quota.cadence.is_none(),
        };
        let kind = if rule.spends_several() {
            Kind::Several
        } else if budget_only {
            Kind::BudgetOnly
        } else {
            Kind::Paced
        };
        let key = (kind, mode);
        let lead = |key| self.clone().lead(key);
        self.queues.ask(key, (), waiter, lead).await
    }

    /// Decides the queue, group after group, until it is empty.
    async fn lead(self, key: (Kind, Enforcement)) {
        while let Some(((), mut group)) = self.queues.next_group(&key) {
            let decided = match key {
                (Kind::BudgetOnly, Enforcement::Enforce) => self.decide_across(&mut group).await,
                (Kind::Paced, Enforcement::Enforce) => self.decide_paced(&mut group).await,
                (Kind::BudgetOnly, Enforcement::Observe) => self.observe_across(&mut group).await,
                (Kind::Paced, Enforcement::Observe) => self.observe_paced(&mut group).await,
                (Kind::Several, Enforcement::Enforce) => {
                    self.decide_several(&mut group, false).await
                }
                (Kind::Several, Enforcement::Observe) => {
                    self.decide_several(&mut group, true).await
                }
            };
            if let Err(error) = decided {
                // The group's statement failed: every waiter not answered yet
                // hears why.
                let replies = group.into_iter().map(|waiter| waiter.reply);
                fail_all(replies, &StoreError::from(error));
            }
        }
    }

    /// Observed decisions on quotas without a cadence, whatever their quota:
    /// one statement spends each quota's slots for its part of the group
    /// regardless; each waiter learns, in arrival order within its quota,
    /// whether enforcement would have refused it. Nothing is given back: a
    /// caller that stopped waiting was granted all the same.
    async fn observe_across(&self, group: &mut Vec<Waiter>) -> Result<(), sqlx::Error> {
        let parts = ByQuota::of(group);
        let quota_asks: Vec<QuotaAsk> = parts
            .rules
            .iter()
            .zip(&parts.asks)
            .map(|(quota, asks)| {
                let total = asks.iter().map(|a| a.slots).sum();
                QuotaAsk::regardless(quota, total)
            })
            .collect();
        let takes = self.store.take_slots_across(&quota_asks, true).await?;
        let shares = parts.shares(group);
        let mut waiters: Vec<Option<Waiter>> = group.drain(..).map(Some).collect();
        for (part, take) in takes.iter().enumerate() {
            let asks = with_room(&parts.asks[part], &shares[part], &take.windows);
            let flags = rationing::would_defer(&asks, 0);
            let spent = rationing::counts_in_order(&asks, 0);
            let members = parts.members[part].iter().zip(&shares[part]);
            for (((&i, &share), would_defer), spent) in members.zip(flags).zip(spent) {
                let Some(waiter) = waiters[i].take() else {
                    continue;
                };
                let before = spent - waiter.ask.slots;
                let refusal = would_defer
                    .then(|| window::refusing(&take.windows, share, before, waiter.ask.slots))
                    .flatten()
                    .map(Deferral::budget);
                let _ = waiter.reply.send(Ok(Reservation {
                    clock: take.clock,
                    windows: take.windows.clone(),
                    spent: Some(spent),
                    refusal,
                    lease: None,
                    further: Vec::new(),
                }));
            }
        }
        Ok(())
    }

    /// Enforced decisions on budget-only quotas, whatever their quota: one
    /// statement takes each quota's slots for its part of the group (never
    /// fewer than its smallest request, so a lone request is all or nothing);
    /// rationing shares each quota's take out; what nobody uses goes back
    /// before anyone hears a refusal.
    async fn decide_across(&self, group: &mut Vec<Waiter>) -> Result<(), sqlx::Error> {
        let parts = ByQuota::of(group);
        let shares = parts.shares(group);
        let quota_asks: Vec<QuotaAsk> = parts
            .rules
            .iter()
            .zip(&parts.asks)
            .zip(&shares)
            .map(|((quota, asks), shares)| QuotaAsk {
                quota: quota.name.clone(),
                windows: quota.windows.clone(),
                share: widest(shares),
                wanted: rationing::to_take(asks).slots,
                smallest: asks.iter().map(|a| a.slots).min().unwrap_or(0),
            })
            .collect();
        let takes = self.store.take_slots_across(&quota_asks, false).await?;
        let mut replies: Vec<Option<Waiter>> = group.drain(..).map(Some).collect();
        for (part, (ask, take)) in quota_asks.iter().zip(&takes).enumerate() {
            let asks = with_room(&parts.asks[part], &shares[part], &take.windows);
            let sharing = rationing::share_out(&asks, taken(take.taken, Limit::Budget, 0));
            self.give_back(&ask.quota, &take.windows, sharing.unused_slots)
                .await;
            let mut abandoned = 0;
            let members = parts.members[part].iter().zip(&shares[part]);
            for ((&i, &share), spent) in members.zip(sharing.counts_after) {
                let Some(waiter) = replies[i].take() else {
                    continue;
                };
                let granted = take.taken - sharing.unused_slots;
                let answer = reservation(take, share, spent, waiter.ask.slots, granted);
                let answered = waiter.reply.send(Ok(answer));
                if spent.is_some() && answered.is_err() {
                    abandoned += waiter.ask.slots; // the caller stopped waiting: nobody emits
                }
            }
            self.give_back(&ask.quota, &take.windows, abandoned).await;
        }
        Ok(())
    }

    /// Enforced decisions on paced quotas, whatever their quota: one
    /// statement takes each quota's slots, tokens and in-flight places for
    /// its part of the group; each part is then settled on its own.
    async fn decide_paced(&self, group: &mut Vec<Waiter>) -> Result<(), sqlx::Error> {
        // In rationing order: the statement makes its leases for the first
        // asks of each quota.
        group.sort_by_key(|w| w.ask.rank);
        let parts = ByQuota::of(group);
        let flows: Vec<Vec<String>> = parts
            .members
            .iter()
            .map(|members| members.iter().map(|&i| group[i].flow.clone()).collect())
            .collect();
        let slots = parts.slots();
        let wanted = parts.paced_asks(&slots, &flows);
        let takes = self.store.take_paced_across(&wanted, false).await?;
        let mut waiters: Vec<Option<Waiter>> = group.drain(..).map(Some).collect();
        for (part, take) in takes.into_iter().enumerate() {
            let members = parts.members[part].iter();
            let part_waiters: Vec<Waiter> = members.filter_map(|&i| waiters[i].take()).collect();
            let shares: Vec<Option<i16>> = part_waiters.iter().map(|w| w.share).collect();
            let asks = with_room(&parts.asks[part], &shares, &take.windows);
            let quota = &parts.rules[part];
            self.settle_paced(quota, part_waiters, &asks, &flows[part], take)
                .await;
        }
        Ok(())
    }

    /// One quota's part of a paced group, once its take is known: rationing
    /// shares the take out (each granted ask that needs a place holds one of
    /// the leases taken); what nobody uses goes back in one statement before
    /// anyone hears a refusal.
    async fn settle_paced(
        &self,
        quota: &QuotaRule,
        waiters: Vec<Waiter>,
        asks: &[Ask],
        flows: &[String],
        take: PacedTake,
    ) {
        let places = take.leases.len() as i64;
        let sharing = rationing::share_out(asks, taken(take.taken, take.slots_bound_by, places));
        let handout = hand_out(&take.leases, flows, &sharing.place_holders);
        let back = PacedGiveBack {
            slots: sharing.unused_slots,
            tokens: if quota.cadence.is_some() {
                sharing.unused_slots
            } else {
                0
            },
            freed: &handout.unused,
            handed: &handout.handed,
        };
        let settled = self.give_back_paced(quota, &take.windows, &back).await;
        // Tokens the grants keep: a refusal by the cadence waits for its own
        // on top of them.
        let spent = take.taken - sharing.unused_slots;
        let (mut abandoned_slots, mut abandoned_leases) = (0, Vec::new());
        for (i, (waiter, refusal)) in waiters.into_iter().zip(sharing.refusals).enumerate() {
            let lease = handout.leases[i];
            let answer = match refusal {
                Some(limit) => {
                    let refusing = (limit == Limit::Budget)
                        .then(|| {
                            window::refusing(&take.windows, waiter.share, spent, waiter.ask.slots)
                        })
                        .flatten();
                    let outlook = take.outlook().refused_by(refusing);
                    Ok(Reservation {
                        clock: take.clock,
                        windows: take.windows.clone(),
                        spent: None,
                        refusal: Some(Deferral::by(limit, &outlook, spent + waiter.ask.slots)),
                        lease: None,
                        further: Vec::new(),
                    })
                }
                // Its place is still leased to another flow of the group:
                // reporting it would be refused. Nobody emits on it; its slot
                // stays counted and the lease expires by itself.
                None if handout.handed_over[i] && !settled => {
                    Err(StoreUnavailable("in-flight place not handed over".to_string()).into())
                }
                None => Ok(Reservation {
                    clock: take.clock,
                    windows: take.windows.clone(),
                    spent: sharing.counts_after[i],
                    refusal: None,
                    lease,
                    further: Vec::new(),
                }),
            };
            let granted = matches!(answer, Ok(Reservation { refusal: None, .. }));
            if waiter.reply.send(answer).is_err() && granted {
                // The caller stopped waiting (a 503): nobody emits.
                abandoned_slots += waiter.ask.slots;
                abandoned_leases.extend(lease);
            }
        }
        self.undo_abandoned(
            &quota.name,
            &take.windows,
            abandoned_slots,
            abandoned_leases,
        )
        .await;
    }

    /// Observed decisions on quotas with a cadence, whatever their quota:
    /// one statement spends each quota's slots regardless and its tokens as
    /// far as they go; each waiter learns, in arrival order within its
    /// quota, which limit would have refused it.
    async fn observe_paced(&self, group: &mut Vec<Waiter>) -> Result<(), sqlx::Error> {
        let parts = ByQuota::of(group);
        // Observed asks take no place: no flow holds one.
        let slots = parts.slots();
        let wanted = parts.paced_asks(&slots, &[]);
        let takes = self.store.take_paced_across(&wanted, true).await?;
        let shares = parts.shares(group);
        let mut waiters: Vec<Option<Waiter>> = group.drain(..).map(Some).collect();
        for (part, take) in takes.iter().enumerate() {
            let asks = with_room(&parts.asks[part], &shares[part], &take.windows);
            let limits = rationing::would_refuse(&asks, 0, take.tokens());
            let spent = rationing::counts_in_order(&asks, 0);
            let members = parts.members[part].iter().zip(&shares[part]);
            for (((&i, &share), limit), spent) in members.zip(limits).zip(spent) {
                let Some(waiter) = waiters[i].take() else {
                    continue;
                };
                // An observed decision shows only the limit, never when it
                // lifts: each refusal says when its own tokens would be
                // there alone.
                let before = spent - waiter.ask.slots;
                let refusing = window::refusing(&take.windows, share, before, waiter.ask.slots);
                let outlook = take.outlook().refused_by(refusing);
                let refusal = limit.map(|limit| Deferral::by(limit, &outlook, waiter.ask.slots));
                let _ = waiter.reply.send(Ok(Reservation {
                    clock: take.clock,
                    windows: take.windows.clone(),
                    // Spent in arrival order, once the store counted them.
                    spent: (take.taken > 0).then_some(spent),
                    refusal,
                    lease: None,
                    further: Vec::new(),
                }));
            }
        }
        Ok(())
    }

    /// Whether everything went back; if not, it stays counted as spent (an
    /// over-count, never an under-count) and the places stay leased until
    /// their leases expire.
    /// Calls that spend several quotas each, whatever their quotas (design.md
    /// §12): one statement decides them in rationing order (observed ones:
    /// in arrival order, spent regardless), each all or nothing across
    /// every window of every quota it spends, first fit. A grant whose
    /// caller stopped waiting is given back to each quota.
    async fn decide_several(
        &self,
        group: &mut Vec<Waiter>,
        observe: bool,
    ) -> Result<(), sqlx::Error> {
        if !observe {
            group.sort_by_key(|w| w.ask.rank);
        }
        let calls: Vec<SeveralAsk<'_>> = group
            .iter()
            .map(|waiter| SeveralAsk {
                quotas: waiter
                    .several
                    .iter()
                    .map(|(quota, amount, share)| (quota, *amount, *share))
                    .collect(),
            })
            .collect();
        let takes = self.store.take_several(&calls, observe).await?;
        for (waiter, take) in group.drain(..).zip(takes) {
            let refusal = (!take.fits).then(|| {
                let refusing = waiter.several.iter().zip(&take.windows).filter_map(
                    |((_, amount, share), windows)| window::refusing(windows, *share, 0, *amount),
                );
                let first = take.windows.first().map_or(&[][..], Vec::as_slice);
                Deferral::budget(
                    refusing
                        .max_by_key(|reopening| reopening.at)
                        .unwrap_or_else(|| fullest(first, take.clock.window_end)),
                )
            });
            let mut quotas = take
                .windows
                .iter()
                .zip(&waiter.several)
                .map(|(windows, (_, amount, _))| (windows.clone(), take.spent.then_some(*amount)));
            let (windows, spent) = quotas.next().unwrap_or_default();
            let answer = Reservation {
                clock: take.clock,
                windows,
                spent,
                refusal,
                lease: None,
                further: quotas.collect(),
            };
            if waiter.reply.send(Ok(answer)).is_err() && take.spent && !observe {
                // The caller stopped waiting: nobody emits.
                for ((quota, amount, _), windows) in waiter.several.iter().zip(&take.windows) {
                    self.give_back(&quota.name, windows, *amount).await;
                }
            }
        }
        Ok(())
    }

    async fn give_back_paced(
        &self,
        quota: &QuotaRule,
        windows: &[WindowCount],
        back: &PacedGiveBack<'_>,
    ) -> bool {
        let given = self.store.give_back_paced(quota, windows, back).await;
        if let Err(error) = &given {
            let (slots, freed, handed) = (back.slots, back.freed.len(), back.handed.len());
            tracing::warn!(%error, quota = quota.name, slots, freed, handed, "not given back: counted as spent, places held till their leases expire");
        }
        given.is_ok()
    }

    /// Grants whose caller stopped waiting: their slots go back and their
    /// places are freed, as a report without a duration frees them. Their
    /// tokens stay spent: the bucket only errs on the slow side.
    async fn undo_abandoned(
        &self,
        quota: &str,
        windows: &[WindowCount],
        slots: i64,
        leases: Vec<Lease>,
    ) {
        self.give_back(quota, windows, slots).await;
        for lease in leases {
            if let Err(error) = self.store.release_lease(lease.id, None).await {
                tracing::warn!(%error, quota, "abandoned grant's lease not freed: it expires by itself");
            }
        }
    }

    async fn give_back(&self, quota: &str, windows: &[WindowCount], slots: i64) {
        self.store.give_back_unused(quota, windows, slots).await;
    }
}

/// A group shared across quotas, split by quota (in quota order, the order
/// the statements lock their rows in): each quota's limits as its latest
/// arrival saw them, its members (indices into the group, in group order)
/// and their asks.
struct ByQuota {
    rules: Vec<QuotaRule>,
    members: Vec<Vec<usize>>,
    asks: Vec<Vec<Ask>>,
    /// Per quota: the widest share of the windows among its members.
    widest_share: Vec<Option<i16>>,
}

impl ByQuota {
    fn of(group: &[Waiter]) -> Self {
        let mut by_quota: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, waiter) in group.iter().enumerate() {
            by_quota.entry(&waiter.quota.name).or_default().push(i);
        }
        let members: Vec<Vec<usize>> = by_quota.into_values().collect();
        let latest = |members: &Vec<usize>| {
            let arrived_last = members.iter().max_by_key(|&&i| group[i].arrival);
            arrived_last.map(|&i| group[i].quota.clone())
        };
        let widest_share = members
            .iter()
            .map(|members| {
                let shares: Vec<Option<i16>> = members.iter().map(|&i| group[i].share).collect();
                widest(&shares)
            })
            .collect();
        Self {
            rules: members.iter().filter_map(latest).collect(),
            asks: members
                .iter()
                .map(|members| members.iter().map(|&i| group[i].ask).collect())
                .collect(),
            members,
            widest_share,
        }
    }

    /// Each quota's members' shares of the windows, in the order of its members.
    fn shares(&self, group: &[Waiter]) -> Vec<Vec<Option<i16>>> {
        let share_of = |members: &Vec<usize>| members.iter().map(|&i| group[i].share).collect();
        self.members.iter().map(share_of).collect()
    }

    /// Each quota's asks' slots, in the order of its members.
    fn slots(&self) -> Vec<Vec<i64>> {
        let slots_of = |asks: &Vec<Ask>| asks.iter().map(|a| a.slots).collect();
        self.asks.iter().map(slots_of).collect()
    }

    /// What each quota's part asks of the paced statement: `slots` from
    /// [`ByQuota::slots`], `flows` its members' flows (none when no ask
    /// needs a place); places only when its asks need them.
    fn paced_asks<'a>(
        &'a self,
        slots: &'a [Vec<i64>],
        flows: &'a [Vec<String>],
    ) -> Vec<(&'a QuotaRule, PacedAsks<'a>)> {
        let parts = self.rules.iter().zip(&self.asks).zip(slots).enumerate();
        parts
            .map(|(part, ((quota, asks), slots))| {
                let to_take = rationing::to_take(asks);
                let asks = PacedAsks {
                    slots,
                    flows: flows.get(part).map_or(&[], Vec::as_slice),
                    share: self.widest_share[part],
                    need_places: to_take.places > 0,
                };
                (quota, asks)
            })
            .collect()
    }
}

/// Which of the leases a group take made each place holder gets.
#[derive(Debug, Default, PartialEq)]
struct Handout {
    /// Per ask of the group: the lease it holds.
    leases: Vec<Option<Lease>>,
    /// Per ask: its lease was made for another flow and is handed over.
    handed_over: Vec<bool>,
    /// Leases handed over, with their new holder's flow.
    handed: Vec<(i64, String)>,
    /// Leases nobody holds: their places are freed.
    unused: Vec<i64>,
}

/// Gives each of `holders` (indices into the asks, whose flows are `flows`)
/// one of `leases`: one made for its own flow if there is one left, else any
/// left, handed over to its flow (a lease is made for an ask before rationing
/// knows who is granted). Rationing never grants more places than were taken.
fn hand_out(leases: &[LabelledLease], flows: &[String], holders: &[usize]) -> Handout {
    let mut left: Vec<Option<&LabelledLease>> = leases.iter().map(Some).collect();
    let mut handout = Handout {
        leases: vec![None; flows.len()],
        handed_over: vec![false; flows.len()],
        ..Handout::default()
    };
    let mut elsewhere = Vec::new();
    for &holder in holders {
        let own_flow = left
            .iter()
            .position(|l| l.is_some_and(|l| flows[l.ask] == flows[holder]));
        match own_flow.and_then(|i| left[i].take()) {
            Some(made) => handout.leases[holder] = Some(made.lease),
            None => elsewhere.push(holder),
        }
    }
    for holder in elsewhere {
        let Some(made) = left.iter_mut().find_map(Option::take) else {
            break;
        };
        handout.leases[holder] = Some(made.lease);
        handout.handed_over[holder] = true;
        handout.handed.push((made.lease.id, flows[holder].clone()));
    }
    handout.unused = left.into_iter().flatten().map(|l| l.lease.id).collect();
    handout
}

/// What a group take took, as rationing reads it: one count, what the
/// group spends from 0 on, every window moving with it (each ask's
/// `ceiling` is its room, [`with_room`]).
fn taken(slots: i64, slots_bound_by: Limit, places: i64) -> Taken {
    Taken {
        count_before: 0,
        slots,
        slots_bound_by,
        places,
    }
}

/// The asks as rationing reads a take of stacked windows: each may reach
/// what the fullest window leaves its share (design.md §12).
fn with_room(asks: &[Ask], shares: &[Option<i16>], windows: &[WindowCount]) -> Vec<Ask> {
    asks.iter()
        .zip(shares)
        .map(|(ask, &share)| Ask {
            ceiling: window::room(windows, share),
            ..*ask
        })
        .collect()
}

/// The share of each window a group may reach: the widest of its members'.
fn widest(shares: &[Option<i16>]) -> Option<i16> {
    shares
        .iter()
        .try_fold(0, |widest: i16, share| share.map(|s| widest.max(s)))
}

/// A waiter's answer from its quota's budget take: granted once `spent`
/// (the group's grants up to its own) is counted, or (`None`) refused by
/// the window that reopens last of those without room once the group's
/// `taken` slots (its grants) are counted.
fn reservation(
    take: &QuotaTake,
    share: Option<i16>,
    spent: Option<i64>,
    slots: i64,
    taken: i64,
) -> Reservation {
    let refusal = match spent {
        Some(_) => None,
        None => Some(Deferral::budget(
            window::refusing(&take.windows, share, taken, slots)
                .or_else(|| window::refusing(&take.windows, share, 0, slots))
                .unwrap_or_else(|| fullest(&take.windows, take.clock.window_end)),
        )),
    };
    Reservation {
        clock: take.clock,
        windows: take.windows.clone(),
        spent,
        refusal,
        lease: None,
        further: Vec::new(),
    }
}

/// The window with the least left, for a refusal none of the windows
/// explains by itself (a group's room went to asks ranked before it).
fn fullest(windows: &[WindowCount], fallback_end: DateTime<Utc>) -> Reopening {
    windows
        .iter()
        .min_by_key(|w| w.ceiling - w.count_before)
        .map_or(
            Reopening {
                period: Period::HOUR,
                at: fallback_end,
            },
            |w| Reopening {
                period: w.period,
                at: w.window_end,
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(id: i64, ask: usize) -> LabelledLease {
        LabelledLease {
            lease: Lease {
                id,
                valid_until: DateTime::UNIX_EPOCH,
            },
            ask,
        }
    }

    fn flows(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn each_holder_gets_a_lease_made_for_its_flow_when_one_is_left() {
        // Leases made for asks 0 and 1 (flows a, b); asks 1 and 2 are granted.
        let handout = hand_out(
            &[made(10, 0), made(11, 1)],
            &flows(&["a", "b", "a"]),
            &[1, 2],
        );
        assert_eq!(
            handout.leases,
            [None, Some(made(11, 1).lease), Some(made(10, 0).lease)]
        );
        assert!(handout.handed.is_empty());
        assert!(handout.unused.is_empty());
    }

    #[test]
    fn a_lease_made_for_another_flow_is_handed_over_and_the_rest_freed() {
        // Ask 0 (flow a, 2 slots) did not fit; ask 1 (flow b) holds the lease
        // made for ask 0, handed over to b; the lease made for ask 2 is unused.
        let handout = hand_out(&[made(10, 0), made(12, 2)], &flows(&["a", "b", "c"]), &[1]);
        assert_eq!(handout.leases, [None, Some(made(10, 0).lease), None]);
        assert_eq!(handout.handed_over, [false, true, false]);
        assert_eq!(handout.handed, [(10, "b".to_string())]);
        assert_eq!(handout.unused, [12]);
    }

    #[test]
    fn no_lease_is_held_twice() {
        let leases = [made(10, 0), made(11, 1), made(12, 2)];
        let handout = hand_out(&leases, &flows(&["a", "a", "b", "b"]), &[0, 2, 3]);
        let held: Vec<i64> = handout.leases.iter().flatten().map(|l| l.id).collect();
        let mut distinct = held.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!((held.len(), distinct.len()), (3, 3), "{held:?}");
        assert_eq!(handout.handed, [(11, "b".to_string())]);
    }
}
