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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use super::rationing::{self, Ask, Rank, Taken};
use crate::decision::Limit;
use crate::store::slots::{give_back_slots, take_slots, Take};
use crate::store::{Refusal, Reservation, Store};

struct Waiter {
    ask: Ask,
    reply: oneshot::Sender<Result<Reservation, String>>,
}

/// Enforced decisions are rationed; observed ones are spent regardless, in
/// arrival order, each told whether enforcement would have refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    Enforce,
    Observe,
}

/// One queue per quota and mode.
type Queues = HashMap<(String, Mode), Vec<Waiter>>;

/// A queue present in the map has a leader task deciding it.
#[derive(Clone)]
pub struct Coalescer {
    store: Store,
    queues: Arc<Mutex<Queues>>,
    arrivals: Arc<AtomicU64>,
}

impl Coalescer {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            queues: Arc::default(),
            arrivals: Arc::default(),
        }
    }

    /// Reserves `slots` of `quota` together with whoever else is asking now.
    pub async fn reserve(
        &self,
        quota: &str,
        slots: i64,
        ceiling: i64,
        deadline: Option<DateTime<Utc>>,
        priority: i16,
    ) -> Result<Reservation, sqlx::Error> {
        self.join(quota, Mode::Enforce, slots, ceiling, deadline, priority)
            .await
    }

    /// Spends `slots` of `quota` regardless, together with whoever else is
    /// observing it now; the refusal says what enforcement would have done.
    pub async fn observe(
        &self,
        quota: &str,
        slots: i64,
        ceiling: i64,
    ) -> Result<Reservation, sqlx::Error> {
        self.join(quota, Mode::Observe, slots, ceiling, None, 0)
            .await
    }

    async fn join(
        &self,
        quota: &str,
        mode: Mode,
        slots: i64,
        ceiling: i64,
        deadline: Option<DateTime<Utc>>,
        priority: i16,
    ) -> Result<Reservation, sqlx::Error> {
        let (reply, answer) = oneshot::channel();
        let arrival = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let ask = Ask {
            slots,
            ceiling,
            needs_place: false,
            rank: Rank::new(deadline, priority, arrival),
        };
        let waiter = Waiter { ask, reply };
        let key = (quota.to_string(), mode);
        let lead = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            match queues.get_mut(&key) {
                Some(queue) => {
                    queue.push(waiter);
                    false
                }
                None => {
                    queues.insert(key.clone(), vec![waiter]);
                    true
                }
            }
        };
        if lead {
            // A task of its own: a caller that gives up must not stop the
            // group it was leading.
            tokio::spawn(self.clone().lead(key));
        }
        answer
            .await
            .map_err(|_| sqlx::Error::Protocol("coalescer stopped".into()))?
            .map_err(sqlx::Error::Protocol)
    }

    /// Decides the quota's queue, group after group, until it is empty.
    async fn lead(self, key: (String, Mode)) {
        loop {
            let group = {
                let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                let Some(queue) = queues.get_mut(&key) else {
                    return;
                };
                if queue.is_empty() {
                    queues.remove(&key);
                    return;
                }
                std::mem::take(queue)
            };
            match key.1 {
                Mode::Enforce => self.decide(&key.0, group).await,
                Mode::Observe => self.observe_group(&key.0, group).await,
            }
        }
    }

    /// One statement spends the whole group's slots regardless; each waiter
    /// learns, in arrival order, whether enforcement would have refused it.
    /// Nothing is given back: a caller that stopped waiting was granted all
    /// the same.
    async fn observe_group(&self, quota: &str, group: Vec<Waiter>) {
        let asks: Vec<Ask> = group.iter().map(|w| w.ask).collect();
        let total = asks.iter().map(|a| a.slots).sum();
        let spent = self.store.reserve_slots(quota, total, 0, true).await;
        let (clock, after) = match spent {
            Ok(r) => (r.clock, r.count_after.unwrap_or(total)),
            Err(error) => {
                let error = error.to_string();
                for waiter in group {
                    let _ = waiter.reply.send(Err(error.clone()));
                }
                return;
            }
        };
        let flags = rationing::would_defer(&asks, after - total);
        let mut count = after - total;
        for (waiter, would_defer) in group.into_iter().zip(flags) {
            count += waiter.ask.slots;
            let _ = waiter.reply.send(Ok(Reservation {
                clock,
                count_after: Some(count),
                refusal: would_defer.then_some(Refusal {
                    limit: Limit::Budget,
                    retry_at: clock.window_end,
                }),
                lease: None,
            }));
        }
    }

    async fn decide(&self, quota: &str, mut group: Vec<Waiter>) {
        if group.len() == 1 {
            // Alone: the all-or-nothing upsert, nothing to share or give back.
            let waiter = group.remove(0);
            let Ask { slots, ceiling, .. } = waiter.ask;
            let reserved = self
                .store
                .reserve_slots(quota, slots, ceiling, false)
                .await
                .map(|r| Reservation {
                    refusal: r.count_after.is_none().then_some(budget_refusal(&r.clock)),
                    ..r
                })
                .map_err(|e| e.to_string());
            let granted = match &reserved {
                Ok(r) if r.count_after.is_some() => Some(r.clock.window_start),
                _ => None,
            };
            if let (Err(_), Some(window)) = (waiter.reply.send(reserved), granted) {
                // The caller stopped waiting (a 503): nobody emits.
                self.give_back(quota, window, slots).await;
            }
            return;
        }
        let asks: Vec<Ask> = group.iter().map(|w| w.ask).collect();
        let rationing::ToTake {
            slots: wanted,
            ceiling,
            ..
        } = rationing::to_take(&asks);
        let take = match take_slots(self.store.pool(), quota, wanted, ceiling).await {
            Ok(take) => take,
            Err(error) => {
                let error = error.to_string();
                for waiter in group {
                    let _ = waiter.reply.send(Err(error.clone()));
                }
                return;
            }
        };
        let sharing = rationing::share_out(&asks, taken(&take));
        // Unused slots go back before anyone hears a refusal, so the window
        // never shows them as spent to a caller who asks next.
        let window = take.clock.window_start;
        self.give_back(quota, window, sharing.unused_slots).await;
        let mut abandoned = 0;
        for (waiter, refusal) in group.into_iter().zip(sharing.refusals) {
            let answered = waiter.reply.send(Ok(reservation(&take, refusal)));
            if refusal.is_none() && answered.is_err() {
                abandoned += waiter.ask.slots; // the caller stopped waiting: nobody emits
            }
        }
        self.give_back(quota, window, abandoned).await;
    }

    async fn give_back(&self, quota: &str, window_start: DateTime<Utc>, slots: i64) {
        if slots == 0 {
            return;
        }
        let back = give_back_slots(self.store.pool(), quota, window_start, slots);
        if let Err(error) = back.await {
            tracing::warn!(%error, quota, slots, "slots not given back: counted as spent");
        }
    }
}

/// What a take-up-to-k statement took, as rationing reads it.
pub(super) fn taken(take: &Take) -> Taken {
    Taken {
        count_before: take.count_after.map_or(0, |after| after - take.taken),
        slots: take.taken,
        slots_bound_by: Limit::Budget,
        places: 0,
    }
}

fn budget_refusal(clock: &crate::clock::ClockReading) -> Refusal {
    Refusal {
        limit: Limit::Budget,
        retry_at: clock.window_end,
    }
}

fn reservation(take: &Take, refusal: Option<Limit>) -> Reservation {
    Reservation {
        clock: take.clock,
        count_after: refusal.is_none().then_some(take.taken),
        refusal: refusal.map(|_| budget_refusal(&take.clock)),
        lease: None,
    }
}
