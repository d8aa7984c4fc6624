//! Counting after the fact. Decisions are tallied, and emissions that never
//! went through the reservation (count mode, deadline bypass) are added to their
//! window, in memory first and then in batches by a background flusher. Nothing
//! here can fail or slow down a decision: a flush that fails, or is dropped
//! mid-transaction, keeps its numbers for the next try. What only a SIGKILL
//! can lose is what is still in memory (design.md §3, guarantee 6).

use std::collections::HashMap;
use std::future::Future;
use std::mem;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::decision::{Decision, Outcome};
use crate::store::Connections;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct TallyKey {
    /// `None`: the window the database clock is in when the batch is written.
    window_start: Option<DateTime<Utc>>,
    quota: Option<String>,
    flow: String,
}

#[derive(Clone, Copy, Debug, Default)]
struct OutcomeCounts {
    granted: i64,
    deferred: i64,
    would_defer: i64,
    bypassed: i64,
    unthrottled: i64,
    would_defer_with_deadline: i64,
}

impl OutcomeCounts {
    fn add(&mut self, other: OutcomeCounts) {
        self.granted += other.granted;
        self.deferred += other.deferred;
        self.would_defer += other.would_defer;
        self.bypassed += other.bypassed;
        self.unthrottled += other.unthrottled;
        self.would_defer_with_deadline += other.would_defer_with_deadline;
    }
}

#[derive(Default)]
struct Pending {
    tallies: HashMap<TallyKey, OutcomeCounts>,
    /// Slots spent without a reservation, by (quota, window).
    slots: HashMap<(String, Option<DateTime<Utc>>), i64>,
}

impl Pending {
    fn merge(&mut self, other: Pending) {
        for (key, counts) in other.tallies {
            self.tallies.entry(key).or_default().add(counts);
        }
        for (key, slots) in other.slots {
            *self.slots.entry(key).or_default() += slots;
        }
    }

    fn is_empty(&self) -> bool {
        self.tallies.is_empty() && self.slots.is_empty()
    }
}

#[derive(Clone, Default)]
pub struct Ledger {
    pending: Arc<Mutex<Pending>>,
    /// Counts still to come: statements answered too late, still running,
    /// whose outcome decides what is counted after the fact.
    expected: Arc<AtomicUsize>,
}

/// A count still to come; dropping it says it came.
struct Expected(Arc<AtomicUsize>);

impl Drop for Expected {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A batch taken out of memory and not yet committed: unless it is, dropping
/// it (a failed write, or a flush cancelled mid-transaction) puts its numbers
/// back. A commit whose answer was lost is then written twice: an over-count,
/// never an under-count.
struct Unwritten<'a> {
    ledger: &'a Ledger,
    batch: Option<Pending>,
}

impl Drop for Unwritten<'_> {
    fn drop(&mut self) {
        if let Some(batch) = self.batch.take() {
            self.ledger.lock().merge(batch);
        }
    }
}

impl Ledger {
    /// Tallies one decision; `had_deadline` marks what enforcement would have
    /// deferred although the work carried a deadline.
    pub fn tally(&self, decision: &Decision, had_deadline: bool) {
        let mut counts = OutcomeCounts::default();
        match decision.outcome {
            Outcome::Granted => counts.granted = 1,
            Outcome::Deferred => counts.deferred = 1,
            Outcome::Bypassed => counts.bypassed = 1,
            Outcome::Unthrottled => counts.unthrottled = 1,
            // Nothing was decided: no tally (the store error is counted).
            Outcome::Unavailable => return,
        }
        counts.would_defer = i64::from(decision.would_defer);
        counts.would_defer_with_deadline = i64::from(decision.would_defer && had_deadline);
        let key = TallyKey {
            window_start: decision.hour_start,
            quota: decision.quota.clone(),
            flow: decision.flow.clone(),
        };
        self.lock().tallies.entry(key).or_default().add(counts);
    }

    /// An observed decision answered before the store did: once the store
    /// does answer over the ceiling, the would-defer joins the tallies.
    pub fn tally_late_would_defer(
        &self,
        window_start: DateTime<Utc>,
        quota: &str,
        flow: &str,
        had_deadline: bool,
    ) {
        let counts = OutcomeCounts {
            would_defer: 1,
            would_defer_with_deadline: i64::from(had_deadline),
            ..OutcomeCounts::default()
        };
        self.add_to_quota(Some(window_start), quota, flow, counts);
    }

    fn add_to_quota(
        &self,
        window_start: Option<DateTime<Utc>>,
        quota: &str,
        flow: &str,
        counts: OutcomeCounts,
    ) {
        let key = TallyKey {
            window_start,
            quota: Some(quota.to_string()),
            flow: flow.to_string(),
        };
        self.lock().tallies.entry(key).or_default().add(counts);
    }

    /// Deadline bypasses a worker client decided by itself while the arbiter
    /// was unreachable (design.md §12), tallied once it reports them.
    pub fn tally_reported_bypasses(
        &self,
        window_start: Option<DateTime<Utc>>,
        quota: &str,
        flow: &str,
        bypasses: i64,
    ) {
        let counts = OutcomeCounts {
            bypassed: bypasses,
            ..OutcomeCounts::default()
        };
        self.add_to_quota(window_start, quota, flow, counts);
    }

    /// Records slots spent without a reservation at `spent_at` (`None`: the
    /// database's now when flushed), to be added to every window of their
    /// quota that instant falls in.
    pub fn spend_after_the_fact(&self, quota: &str, spent_at: Option<DateTime<Utc>>, slots: i64) {
        *self
            .lock()
            .slots
            .entry((quota.to_string(), spent_at))
            .or_default() += slots;
    }

    /// Marks a count still to come; the last flush at shutdown waits for it.
    fn expect(&self) -> Expected {
        self.expected.fetch_add(1, Ordering::AcqRel);
        Expected(self.expected.clone())
    }

    /// Runs `settlement`, which decides a count still to come, in the
    /// background; the last flush at shutdown waits for it.
    pub(crate) fn settle_later(&self, settlement: impl Future<Output = ()> + Send + 'static) {
        let expected = self.expect();
        tokio::spawn(async move {
            settlement.await;
            drop(expected);
        });
    }

    /// Writes everything pending in one transaction; on failure, or when
    /// this future is dropped before the commit, the numbers are put back
    /// for the next flush.
    pub async fn flush(&self, pool: &Connections) -> Result<(), sqlx::Error> {
        let batch = mem::take(&mut *self.lock());
        if batch.is_empty() {
            return Ok(());
        }
        let mut unwritten = Unwritten {
            ledger: self,
            batch: Some(batch),
        };
        let written = write_batch(pool, unwritten.batch.as_ref().expect("taken above")).await;
        if written.is_ok() {
            unwritten.batch = None;
        }
        written
    }

    /// The last flush, at shutdown: waits (up to `grace`) for the counts
    /// still to come, then writes, retrying while the store does not answer
    /// until `grace` is spent. What is left is reported as lost.
    pub async fn flush_before_exit(&self, pool: &Connections, grace: Duration) {
        let until = tokio::time::Instant::now() + grace;
        while self.expected.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        loop {
            let error = match tokio::time::timeout_at(until, self.flush(pool)).await {
                Ok(Ok(())) if self.lock().is_empty() => return,
                Ok(Ok(())) => continue,
                Ok(Err(error)) => error.to_string(),
                Err(_) => "no answer in time".to_string(),
            };
            if tokio::time::Instant::now() >= until {
                let pending = self.lock();
                let slots: i64 = pending.slots.values().sum();
                return tracing::error!(
                    %error,
                    slots,
                    tallies = pending.tallies.len(),
                    "counts made after the fact lost at shutdown: the store did not take them"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn write_batch(pool: &Connections, batch: &Pending) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    if !batch.slots.is_empty() {
        let (mut quotas, mut windows, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for ((quota, window), n) in &batch.slots {
            quotas.push(quota.clone());
            windows.push(*window);
            slots.push(*n);
        }
        sqlx::query_file!(
            "sql/count_slots.sql",
            &quotas,
            &windows as &[Option<DateTime<Utc>>],
            &slots
        )
        .execute(&mut tx)
        .await?;
    }
    if !batch.tallies.is_empty() {
        let mut columns = TallyColumns::default();
        for (key, counts) in &batch.tallies {
            columns.push(key, counts);
        }
        let c = columns;
        sqlx::query_file!(
            "sql/record_tallies.sql",
            &c.windows as &[Option<DateTime<Utc>>],
            &c.quotas as &[Option<String>],
            &c.flows,
            &c.granted,
            &c.deferred,
            &c.would_defer,
            &c.bypassed,
            &c.unthrottled,
            &c.would_defer_with_deadline
        )
        .execute(&mut tx)
        .await?;
    }
    tx.commit().await
}

#[derive(Default)]
struct TallyColumns {
    windows: Vec<Option<DateTime<Utc>>>,
    quotas: Vec<Option<String>>,
    flows: Vec<String>,
    granted: Vec<i64>,
    deferred: Vec<i64>,
    would_defer: Vec<i64>,
    bypassed: Vec<i64>,
    unthrottled: Vec<i64>,
    would_defer_with_deadline: Vec<i64>,
}

impl TallyColumns {
    fn push(&mut self, key: &TallyKey, counts: &OutcomeCounts) {
        self.windows.push(key.window_start);
        self.quotas.push(key.quota.clone());
        self.flows.push(key.flow.clone());
        self.granted.push(counts.granted);
        self.deferred.push(counts.deferred);
        self.would_defer.push(counts.would_defer);
        self.bypassed.push(counts.bypassed);
        self.unthrottled.push(counts.unthrottled);
        self.would_defer_with_deadline
            .push(counts.would_defer_with_deadline);
    }
}
