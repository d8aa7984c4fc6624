//! Batch reservations (stateless rationing): the items of one request are
//! ordered by deadline ASC NULLS LAST, flow priority, input order; due items
//! are bypassed without the reservation; every other item is a single
//! decision, all of them at once and first asked in that order, so that the
//! items of one quota join the coalescer's group statement in that order and
//! are shared out by the one rationing core, like concurrent reservations
//! (design.md §9).

use super::{with_rule, Reservations};
use crate::bypass::BypassDesk;
use crate::domain::catalog::Handling;
use crate::domain::catalog::Rule;
use crate::domain::decision::{Decision, Outcome, SlotRequest};
use crate::domain::rationing::Rank;
use crate::shell::all_at_once;
use crate::store::{StoreError, RETRY_AFTER_UNAVAILABLE};

/// Most items one batch may carry.
pub const MAX_BATCH_ITEMS: usize = 500;

/// Where each item of a batch goes, indices into the request, each list in
/// rationing order.
#[derive(Default)]
struct Sorted {
    due: Vec<usize>,
    unknown: Vec<usize>,
    counted: Vec<(usize, Rule)>,
    observed: Vec<(usize, Rule)>,
    enforced: Vec<(usize, Rule)>,
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
    /// The decision of `item`, or none when the store was out of reach (it
    /// is then kept as undecided). A statement that failed is no outage: it
    /// fails the batch (500).
    fn sort_out(
        &mut self,
        decided: Result<Decision, StoreError>,
        (i, rule): &(usize, Rule),
    ) -> Result<Option<(usize, Decision)>, StoreError> {
        match decided {
            Ok(decision) => Ok(Some((*i, decision))),
            Err(unavailable @ StoreError::Unavailable(_)) => {
                self.items.push((*i, Some(rule.clone())));
                self.cause.get_or_insert(unavailable);
                Ok(None)
            }
            Err(failed) => Err(failed),
        }
    }
}

impl Reservations {
    /// One decision per request, in input order. An item the store could
    /// not decide in time (its quota out of reach, or the catalog never
    /// read) is `unavailable`; due items are bypassed all the same, so a
    /// batch fails as a whole (503) only when none of its items could be
    /// decided. Slots already spent for the rest of a batch that fails
    /// (500: a statement failed) stay spent: over-count, never under-count.
    pub(crate) async fn decide_batch(
        &self,
        bypass: &BypassDesk,
        requests: &[SlotRequest],
    ) -> Result<Vec<Decision>, StoreError> {
        let mut sorted = self.sort_batch(bypass, requests);
        // Every item as a single decision, all at once, so that the batch
        // answers within one time budget however many quotas it names. Their
        // first polls come in rationing order, so the items of one quota
        // queue for the coalescer's group statement in that order: it takes
        // their slots (tokens and places too) and shares them out as it does
        // for concurrent single reservations (design.md §9).
        let enforced = all_at_once(
            sorted
                .enforced
                .iter()
                .map(|(i, rule)| self.enforce(with_rule(rule), rule, &requests[*i])),
        );
        let observed = all_at_once(
            sorted
                .observed
                .iter()
                .map(|(i, rule)| self.observe(with_rule(rule), rule, &requests[*i])),
        );
        let (enforced, observed) = tokio::join!(enforced, observed);

        let mut settled = Vec::new();
        for (decided, item) in enforced.into_iter().zip(&sorted.enforced) {
            settled.extend(sorted.undecided.sort_out(decided, item)?);
        }
        if sorted.undecided.items.len() == requests.len() {
            return Err(sorted
                .undecided
                .cause
                .unwrap_or_else(crate::catalog::not_loaded));
        }
        settled.extend(sorted.observed.iter().map(|(i, _)| *i).zip(observed));
        let mut decisions: Vec<Option<Decision>> = vec![None; requests.len()];
        for i in sorted.due {
            decisions[i] = Some(bypass.grant(&requests[i]));
        }
        for (i, rule) in sorted.counted {
            let decision =
                self.count_after_the_fact(with_rule(&rule), &rule, &requests[i].amounts(&rule));
            settled.push((i, decision));
        }
        for (i, decision) in settled {
            decisions[i] = Some(self.record(decision, requests[i].deadline.is_some(), true));
        }
        for i in sorted.unknown {
            let decision = Decision::new(Outcome::Unthrottled, &requests[i].flow);
            decisions[i] = Some(self.record(decision, requests[i].deadline.is_some(), false));
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
        let mut handlings: Vec<Option<Handling>> = requests
            .iter()
            .map(|r| Some(Handling::of(snapshot.as_deref(), &r.flow)))
            .collect();
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|&i| {
            let rule = handlings[i].as_ref().and_then(Handling::rule);
            let priority = rule.map_or(i16::MAX, |r| r.flow.priority);
            Rank::new(requests[i].deadline, priority, i as u64)
        });
        let mut sorted = Sorted::default();
        for i in order {
            if bypass.is_due(&requests[i]) {
                sorted.due.push(i);
                continue;
            }
            match handlings[i].take().expect("each item is sorted once") {
                Handling::CatalogNotLoaded => sorted.undecided.items.push((i, None)),
                Handling::Unknown => sorted.unknown.push(i),
                Handling::Count(rule) => sorted.counted.push((i, rule)),
                Handling::Observe(rule) => sorted.observed.push((i, rule)),
                // A stale catalog may be obeying a flag changed since:
                // enforced items fail closed (`unavailable`).
                Handling::Enforce(rule) if self.catalog.is_stale() => {
                    sorted
                        .undecided
                        .cause
                        .get_or_insert_with(crate::catalog::stale);
                    sorted.undecided.items.push((i, Some(rule)));
                }
                Handling::Enforce(rule) => sorted.enforced.push((i, rule)),
            }
        }
        sorted
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
