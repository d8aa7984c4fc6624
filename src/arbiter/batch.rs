//! Batch reservations (stateless rationing): the items of one request are
//! ordered by deadline ASC NULLS LAST, flow priority, input order; due items
//! are bypassed without the reservation; each enforced quota then takes the
//! slots it has left in ONE statement, shared out in that order. Items of
//! paced quotas join the coalescer's group statement all at once, in that
//! order.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use super::coalesce::taken;
use super::observe::{late_would_defers, past_ceiling};
use super::rationing::{self, Ask, Rank};
use super::shell::{Operation, StoreError, RETRY_AFTER_UNAVAILABLE};
use super::{catalog_not_loaded, with_rule, Arbiter};
use crate::bypass::BypassDesk;
use crate::catalog::{Mode, Rule};
use crate::decision::{Decision, Limit, Outcome, SlotRequest};

/// Most items one batch may carry.
pub const MAX_BATCH_ITEMS: usize = 500;

/// Where each item of a batch goes, indices into the request.
#[derive(Default)]
struct Sorted {
    due: Vec<usize>,
    unknown: Vec<usize>,
    counted: Vec<(usize, Rule)>,
    observed: BTreeMap<String, Vec<(usize, Rule)>>,
    enforced: BTreeMap<String, Vec<(usize, Rule)>>,
    /// Enforced items decided as single reservations, all at once: paced
    /// quotas (the coalescer takes their tokens and places with the slots),
    /// flows enforced for a share of their refusals only.
    limited: Vec<(usize, Rule)>,
    /// Observed items of quotas with a cadence, decided the same way.
    observed_paced: Vec<(usize, Rule)>,
    undecided: Undecided,
}

/// Items the store could not decide in time, and why.
#[derive(Default)]
struct Undecided {
    /// With their rule, unless the catalog was never read.
    items: Vec<(usize, Option<Rule>)>,
    cause: Option<StoreError>,
}

impl Undecided {
    /// The decisions of `items`, or none when the store was out of reach
    /// (they are then kept as undecided). A statement that failed is no
    /// outage: it fails the batch (500).
    fn sort_out(
        &mut self,
        decided: Result<Vec<(usize, Decision)>, StoreError>,
        items: &[(usize, Rule)],
    ) -> Result<Vec<(usize, Decision)>, StoreError> {
        match decided {
            Ok(decisions) => Ok(decisions),
            Err(unavailable @ StoreError::Unavailable(_)) => {
                self.items
                    .extend(items.iter().map(|(i, rule)| (*i, Some(rule.clone()))));
                self.cause.get_or_insert(unavailable);
                Ok(Vec::new())
            }
            Err(failed) => Err(failed),
        }
    }
}

impl Arbiter {
    /// One decision per request, in input order. An item the store could
    /// not decide in time (its quota out of reach, or the catalog never
    /// read) is `unavailable`; due items are bypassed all the same, so a
    /// batch fails as a whole (503) only when none of its items could be
    /// decided. Slots already spent for the rest of a batch that fails
    /// (500: a statement failed) stay spent: over-count, never under-count.
    pub async fn decide_batch(
        &self,
        bypass: &BypassDesk,
        requests: &[SlotRequest],
    ) -> Result<Vec<Decision>, StoreError> {
        let mut sorted = self.sort_batch(bypass, requests);
        // Every store call at once, so that the batch answers within one
        // time budget however many quotas it names. Paced quotas and flows
        // enforced for a share only go through the single decision and all
        // its limits; their first polls come in rationing order, so items of
        // one quota queue for a group statement in that order.
        let enforced = all_at_once(
            sorted
                .enforced
                .values()
                .map(|items| self.ration_enforced(requests, items)),
        );
        let limited = all_at_once(sorted.limited.iter().map(|(i, rule)| async move {
            let decision = self.enforce(with_rule(rule), rule, &requests[*i]).await;
            decision.map(|decision| vec![(*i, decision)])
        }));
        let observed = all_at_once(
            sorted
                .observed
                .values()
                .map(|items| self.observe_batch(requests, items)),
        );
        let observed_paced = all_at_once(
            sorted
                .observed_paced
                .iter()
                .map(|(i, rule)| self.observe(with_rule(rule), rule, &requests[*i])),
        );
        let (enforced, limited, observed, observed_paced) =
            tokio::join!(enforced, limited, observed, observed_paced);

        let mut settled = Vec::new();
        let enforced_groups = sorted.enforced.values().map(Vec::as_slice);
        let limited_items = sorted.limited.iter().map(std::slice::from_ref);
        for (decided, items) in enforced
            .into_iter()
            .chain(limited)
            .zip(enforced_groups.chain(limited_items))
        {
            settled.extend(sorted.undecided.sort_out(decided, items)?);
        }
        if sorted.undecided.items.len() == requests.len() {
            return Err(sorted.undecided.cause.unwrap_or_else(catalog_not_loaded));
        }
        settled.extend(observed.into_iter().flatten());
        let observed_paced_items = sorted.observed_paced.iter().map(|(i, _)| *i);
        settled.extend(observed_paced_items.zip(observed_paced));
        let mut decisions: Vec<Option<Decision>> = vec![None; requests.len()];
        for i in sorted.due {
            decisions[i] = Some(bypass.grant(&requests[i]));
        }
        for (i, rule) in sorted.counted {
            let decision = self.count_after_the_fact(with_rule(&rule), &rule, requests[i].count);
            settled.push((i, decision));
        }
        for (i, decision) in settled {
            decisions[i] = Some(self.settle(decision, requests[i].deadline.is_some(), true));
        }
        for i in sorted.unknown {
            let decision = Decision::new(Outcome::Unthrottled, &requests[i].flow);
            decisions[i] = Some(self.settle(decision, requests[i].deadline.is_some(), false));
        }
        // Not settled: nothing was decided, so nothing is tallied (the
        // failed store call is counted in `store_errors_total`).
        for (i, rule) in sorted.undecided.items {
            decisions[i] = Some(unavailable(&requests[i], rule.as_ref()));
        }
        Ok(decisions
            .into_iter()
            .map(|d| d.expect("every item is decided"))
            .collect())
    }

    fn sort_batch(&self, bypass: &BypassDesk, requests: &[SlotRequest]) -> Sorted {
        let snapshot = self.catalog.snapshot();
        let rules: Vec<Option<Rule>> = requests
            .iter()
            .map(|r| snapshot.as_ref().and_then(|s| s.rule(&r.flow)))
            .collect();
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|&i| {
            let priority = rules[i].as_ref().map_or(i16::MAX, |r| r.flow.priority);
            Rank::new(requests[i].deadline, priority, i as u64)
        });
        let mut sorted = Sorted::default();
        for i in order {
            if bypass.is_due(&requests[i]) {
                sorted.due.push(i);
                continue;
            }
            // Before the first catalog load an enforced flow cannot be told
            // from an unknown one: fail closed, as /v1/reserve does.
            if snapshot.is_none() {
                sorted.undecided.items.push((i, None));
                continue;
            }
            let Some(rule) = rules[i].clone() else {
                sorted.unknown.push(i);
                continue;
            };
            let quota = rule.quota.name.clone();
            // The budget (headroom included) is shared out of one take of
            // the batch's own; paced quotas go to the coalescer's group
            // statement, which takes their tokens and places too. Observed
            // decisions take no place: only a cadence adds to the budget.
            let paced = !rule.quota.decided_by_window_alone();
            match rule.flow.mode {
                Mode::Count => sorted.counted.push((i, rule)),
                Mode::Observe if rule.quota.cadence.is_some() => {
                    sorted.observed_paced.push((i, rule))
                }
                Mode::Observe => sorted.observed.entry(quota).or_default().push((i, rule)),
                Mode::Enforce if paced || rule.flow.enforce_percent < 100 => {
                    sorted.limited.push((i, rule))
                }
                Mode::Enforce => sorted.enforced.entry(quota).or_default().push((i, rule)),
            }
        }
        sorted
    }

    /// Items of one enforced quota: one take-up-to-k statement, shared out in
    /// rationing order by [`rationing::share_out`], each item all or nothing
    /// within its flow's part of the window.
    async fn ration_enforced(
        &self,
        requests: &[SlotRequest],
        items: &[(usize, Rule)],
    ) -> Result<Vec<(usize, Decision)>, StoreError> {
        let quota = &items[0].1.quota;
        let asks: Vec<Ask> = items
            .iter()
            .enumerate()
            .map(|(k, (i, rule))| Ask {
                slots: requests[*i].count,
                ceiling: quota.ceiling_for(rule.flow.priority),
                needs_place: false,
                rank: Rank::new(requests[*i].deadline, rule.flow.priority, k as u64),
            })
            .collect();
        let rationing::ToTake {
            slots: wanted,
            ceiling,
            ..
        } = rationing::to_take(&asks);
        if ceiling < 1 {
            // The guard runs before the upsert, as in the single decision.
            let clock = self.read_clock().await?;
            return Ok(items
                .iter()
                .map(|(i, rule)| (*i, with_rule(rule).deferred_on_budget(&clock)))
                .collect());
        }
        let (store, name) = (self.store.clone(), quota.name.clone());
        let take = async move { store.take_slots(&name, wanted, ceiling).await };
        let settle = self.giving_back(&quota.name);
        let take = self
            .shell
            .run_detached(Operation::TakeSlots, take, settle)
            .await?;
        let sharing = rationing::share_out(&asks, taken(take.count_after, take.taken));
        let decisions = items
            .iter()
            .zip(sharing.refusals.into_iter().zip(sharing.counts_after))
            .map(|((i, rule), refusal)| match refusal {
                (Some(_), _) => (*i, with_rule(rule).deferred_on_budget(&take.clock)),
                (None, count_after) => {
                    let mut decision = with_rule(rule);
                    if let Some(count_after) = count_after {
                        decision = decision.counted(count_after, &take.clock);
                    }
                    decision.window_start = Some(take.clock.window_start);
                    (*i, decision)
                }
            })
            .collect();
        if sharing.unused_slots > 0 {
            self.give_back(&quota.name, take.clock.window_start, sharing.unused_slots)
                .await;
        }
        Ok(decisions)
    }

    /// Slots taken that no item could use (1 left, the next item needs 2).
    /// Failing to give them back leaves an over-count, never an under-count.
    async fn give_back(&self, quota: &str, window_start: chrono::DateTime<chrono::Utc>, n: i64) {
        let given = self.store.give_back_slots(quota, window_start, n);
        if let Err(error) = self.shell.run(Operation::GiveBackSlots, given).await {
            tracing::warn!(%error, quota, slots = n, "slots not given back; left as over-count");
        }
    }

    /// Items of one observed quota: one statement spends all their slots;
    /// each item says whether enforcement would have deferred it.
    async fn observe_batch(
        &self,
        requests: &[SlotRequest],
        items: &[(usize, Rule)],
    ) -> Vec<(usize, Decision)> {
        let rule = &items[0].1;
        let asks: Vec<Ask> = items
            .iter()
            .map(|(i, rule)| {
                let ceiling = rule.quota.ceiling_for(rule.flow.priority);
                Ask::observed(requests[*i].count, ceiling)
            })
            .collect();
        let asked: Vec<(String, bool)> = items
            .iter()
            .map(|(i, rule)| (rule.flow.name.clone(), requests[*i].deadline.is_some()))
            .collect();
        let late = || late_would_defers(rule.quota.name.clone(), asked, asks.clone());
        let total = asks.iter().map(|a| a.slots).sum();
        let reservation = self.spend_observed(rule, total, late).await;
        let window_start = reservation
            .as_ref()
            .map(|r| r.clock.window_start)
            .or_else(|| self.clock.window_start());
        let counted = reservation
            .as_ref()
            .and_then(|r| Some((r.count_after?, r.clock)));
        let past = counted.map(|(after, _)| past_ceiling(after, &asks));
        // Spent in input order, once the store counted them.
        let counts = counted.map(|(after, clock)| {
            let counts = rationing::counts_in_order(&asks, after - total);
            (counts, clock)
        });
        items
            .iter()
            .enumerate()
            .map(|(k, (i, rule))| {
                let mut decision = with_rule(rule);
                if let Some((counts, clock)) = &counts {
                    decision = decision.counted(counts[k], clock);
                }
                decision.window_start = window_start;
                decision.would_defer = past.as_ref().is_some_and(|p| p[k]);
                decision.limit = decision.would_defer.then_some(Limit::Budget);
                (*i, decision)
            })
            .collect()
    }
}

/// An item the store could not decide in time: ask again shortly.
fn unavailable(request: &SlotRequest, rule: Option<&Rule>) -> Decision {
    let mut decision = match rule {
        Some(rule) => with_rule(rule),
        None => Decision::new(Outcome::Unavailable, &request.flow),
    };
    decision.outcome = Outcome::Unavailable;
    decision.retry_after_seconds = Some(RETRY_AFTER_UNAVAILABLE.as_secs() as i64);
    decision
}

/// Runs `futures` together and answers their outputs in order. Each is first
/// polled in order, so decisions that queue for a group statement on their
/// first poll queue in that order.
async fn all_at_once<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in running.iter_mut().zip(outputs.iter_mut()) {
            let Some(polled) = future.as_mut() else {
                continue;
            };
            match polled.as_mut().poll(cx) {
                Poll::Ready(value) => {
                    *output = Some(value);
                    *future = None;
                }
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future ran to its end"))
        .collect()
}
