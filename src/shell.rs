//! The one way the decision paths call the store (design.md §9). A call runs
//! within the decision's time budget; a failure is counted under its
//! operation and classified: a store out of reach (or too slow) is
//! [`StoreError::Unavailable`] (503), a statement that failed is
//! [`StoreError::Failed`] (500). A decision statement's time is measured, and
//! a database clock reading its answer carries is kept for the paths that
//! must answer without the store.
//!
//! Stopping a statement mid-flight leaves it unknown whether it spent
//! anything. A call that must not be lost runs detached, as a task of its
//! own: its answer goes to the caller while it waits, and what no caller uses
//! (a failure, or an answer that came after the caller stopped waiting) to
//! the settling the caller left (give back what it took, count it after the
//! fact, tally it late). A call run in place is dropped with its caller:
//! only for calls whose transaction then rolls back, whose callee undoes what
//! nobody waits for (the coalescer), or whose late effect is harmless.

pub(crate) mod gather;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::clock::DbClock;
use crate::domain::ClockReading;
use crate::metrics::Metrics;
use crate::store::{CatalogError, Reservation, StoreError, StoreUnavailable, Take};
use crate::tally::Ledger;

/// How long a detached call may run before it is given up: its settling then
/// hears that the store gave no answer (what it spent stays counted: an
/// over-count, never an under-count).
const LATE_LIMIT: Duration = Duration::from_secs(60);

/// A store operation of the decision paths, by its label in
/// `quota_arbiter_store_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    Reserve,
    Admit,
    TakeSlots,
    ClaimWork,
    WorkBacklog,
    EnqueueWork,
    GetWork,
    FinishWork,
    ReleaseLease,
    HoldLease,
    Settle,
    AdaptCadence,
    ShareStream,
    ReadCatalog,
    ChangeCatalog,
    ReadHistory,
    Readiness,
}

impl Operation {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Operation::Reserve => "reserve",
            Operation::Admit => "admit",
            Operation::TakeSlots => "take_slots",
            Operation::ClaimWork => "claim_work",
            Operation::WorkBacklog => "work_backlog",
            Operation::EnqueueWork => "enqueue_work",
            Operation::GetWork => "get_work",
            Operation::FinishWork => "finish_work",
            Operation::ReleaseLease => "release_lease",
            Operation::HoldLease => "hold_lease",
            Operation::Settle => "settle",
            Operation::AdaptCadence => "adapt_cadence",
            Operation::ShareStream => "share_stream",
            Operation::ReadCatalog => "read_catalog",
            Operation::ChangeCatalog => "change_catalog",
            Operation::ReadHistory => "read_history",
            Operation::Readiness => "readiness",
        }
    }

    /// A statement that decides (spends slots): its time is what
    /// `reserve_duration_seconds` measures.
    fn decides(self) -> bool {
        matches!(self, Operation::Reserve | Operation::TakeSlots)
    }
}

/// What a store call fails with: a store error, or (for some calls) an
/// answer of the call's own that the shell passes on as it is.
pub(crate) trait CallError: From<StoreError> {
    /// The store error in it, if it is one.
    fn store_error(&self) -> Option<&StoreError>;
}

impl CallError for StoreError {
    fn store_error(&self) -> Option<&StoreError> {
        Some(self)
    }
}

impl CallError for CatalogError {
    fn store_error(&self) -> Option<&StoreError> {
        match self {
            CatalogError::Store(error) => Some(error),
            CatalogError::Invalid(_) | CatalogError::NotFound(_) | CatalogError::Conflict(_) => {
                None
            }
        }
    }
}

impl<E> Answer for crate::store::Settlement<E> {
    fn clock(&self) -> Option<ClockReading> {
        None
    }
}

/// What a store call answers: the database clock reading it carries, if any.
pub(crate) trait Answer {
    fn clock(&self) -> Option<ClockReading>;
}

impl Answer for Reservation {
    fn clock(&self) -> Option<ClockReading> {
        Some(self.clock)
    }
}

impl Answer for Take {
    fn clock(&self) -> Option<ClockReading> {
        Some(self.clock)
    }
}

impl Answer for ClockReading {
    fn clock(&self) -> Option<ClockReading> {
        Some(*self)
    }
}

/// Answers that carry no clock reading.
macro_rules! no_clock {
    ($($answer:ty),* $(,)?) => {
        $(impl Answer for $answer {
            fn clock(&self) -> Option<ClockReading> {
                None
            }
        })*
    };
}

no_clock!(
    (),
    bool,
    i64,
    Option<i64>,
    crate::store::QuotaRow,
    Option<crate::store::QuotaRow>,
    Vec<crate::store::QuotaRow>,
    crate::store::FlowRow,
    Option<crate::store::FlowRow>,
    Vec<crate::store::FlowRow>,
    crate::store::RouteClassRow,
    Option<crate::store::RouteClassRow>,
    Vec<crate::store::RouteClassRow>,
    Vec<crate::store::WindowRow>,
    Vec<crate::store::UsageRow>,
    Vec<crate::store::QuotaShare>,
    crate::store::LeaseRelease,
    Option<crate::store::AdaptedCadence>,
    Result<crate::report::Report, String>,
    crate::domain::admission::Admission,
    Vec<crate::domain::admission::Admission>,
    crate::store::work::Backlog,
    Option<crate::store::WorkItem>,
    Vec<(crate::store::WorkItem, bool)>,
    Option<(crate::store::WorkItem, Option<i64>)>,
    Option<crate::store::ReleasedLease>,
    Vec<String>,
    crate::store::claim::BegunClaim<'_>,
    crate::store::claim::LockedClaim<'_>,
    crate::store::claim::ClaimLeases,
);

/// Runs the decision paths' store calls.
#[derive(Clone)]
pub(crate) struct Shell {
    metrics: Metrics,
    clock: DbClock,
    /// Detached calls are its settlements: a graceful shutdown waits for
    /// them (a count or a give-back still to come) before its last flush.
    ledger: Ledger,
    budget: Duration,
    /// Calls of one decision that share one budget end by then.
    deadline: Option<Instant>,
}

impl Shell {
    pub(crate) fn new(metrics: Metrics, clock: DbClock, ledger: Ledger, budget: Duration) -> Self {
        Self {
            metrics,
            clock,
            ledger,
            budget,
            deadline: None,
        }
    }

    /// A shell whose calls together get one time budget, from now (a claim's
    /// look, takes and lease); each call of `self` gets a budget of its own.
    pub(crate) fn one_budget(&self) -> Self {
        Self {
            deadline: Some(Instant::now() + self.budget),
            ..self.clone()
        }
    }

    /// Runs `call` in place, within the time budget.
    pub(crate) async fn run<T, E>(
        &self,
        operation: Operation,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, StoreError>
    where
        T: Answer,
        E: Into<StoreError>,
    {
        self.run_as(operation, async { call.await.map_err(Into::into) })
            .await
    }

    /// Runs `call` in place, within the time budget, keeping its own error
    /// type: a store failure in it is counted as [`Shell::run`] counts one;
    /// an answer of its own (a catalog change refused) passes uncounted.
    pub(crate) async fn run_as<T, E>(
        &self,
        operation: Operation,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E>
    where
        T: Answer,
        E: CallError,
    {
        let started = Instant::now();
        match tokio::time::timeout_at(self.ends(started), call).await {
            Ok(Ok(answer)) => Ok(self.answered(operation, started, answer)),
            Ok(Err(error)) if error.store_error().is_none() => Err(error),
            Ok(Err(error)) => Err(self.failed(operation, error)),
            Err(_) => Err(E::from(self.failed(operation, self.ran_out()))),
        }
    }

    /// An answer in time: its latency recorded (deciding statements and
    /// admissions), the database clock it read kept.
    fn answered<T: Answer>(&self, operation: Operation, started: Instant, answer: T) -> T {
        let seconds = started.elapsed().as_secs_f64();
        if operation.decides() {
            self.metrics.record_reserve_seconds(seconds);
        } else if operation == Operation::Admit {
            self.metrics.record_admit_seconds(seconds);
        }
        if let Some(clock) = answer.clock() {
            self.clock.note(clock);
        }
        answer
    }

    /// A store failure (or no answer in time), counted under its operation.
    fn failed<E>(&self, operation: Operation, error: E) -> E {
        self.metrics.store_error(operation.label());
        error
    }

    /// Waits, within the time budget, for an answer another task's call
    /// gives (a group's leader): a failure there was counted by that call,
    /// so only this wait running out is counted here.
    pub(crate) async fn wait<T>(
        &self,
        operation: Operation,
        answer: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(self.ends(Instant::now()), answer).await {
            Ok(answer) => answer,
            Err(_) => {
                self.metrics.store_error(operation.label());
                Err(self.ran_out())
            }
        }
    }

    /// When a call started at `started` must have its answer: the shared
    /// budget's end, or a budget of its own.
    fn ends(&self, started: Instant) -> Instant {
        self.deadline.unwrap_or(started + self.budget)
    }

    /// What a call that got no answer within the budget fails with.
    fn ran_out(&self) -> StoreError {
        StoreUnavailable(format!("no answer within {:?}", self.budget)).into()
    }

    /// Runs `call` detached, within the time budget. `settle` gets every
    /// failure (before the caller hears it) and an answer that came after
    /// the caller stopped waiting: whatever no caller uses.
    pub(crate) async fn run_detached<T, E, S>(
        &self,
        operation: Operation,
        call: impl Future<Output = Result<T, E>> + Send + 'static,
        settle: impl FnOnce(Result<T, StoreError>) -> S + Send + 'static,
    ) -> Result<T, StoreError>
    where
        T: Answer + Send + 'static,
        E: Into<StoreError> + Send + 'static,
        S: Future<Output = ()> + Send + 'static,
    {
        self.run(operation, detach(&self.ledger, call, settle))
            .await
    }

    /// Waits, as [`Shell::wait`], for an answer another task's call gives,
    /// detached as [`Shell::run_detached`]: an answer that comes after this
    /// wait ran out goes to `settle` (a claim's share of its group's take).
    pub(crate) async fn wait_detached<T, S>(
        &self,
        operation: Operation,
        answer: impl Future<Output = Result<T, StoreError>> + Send + 'static,
        settle: impl FnOnce(Result<T, StoreError>) -> S + Send + 'static,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        S: Future<Output = ()> + Send + 'static,
    {
        self.wait(operation, detach(&self.ledger, answer, settle))
            .await
    }
}

/// Starts `call` as a task of its own (one of `ledger`'s settlements, so a
/// graceful shutdown waits for it); the future answers what it answers,
/// after `settle` has had a failure. A success that finds the future gone
/// goes to `settle` instead.
fn detach<T, E, S>(
    ledger: &Ledger,
    call: impl Future<Output = Result<T, E>> + Send + 'static,
    settle: impl FnOnce(Result<T, StoreError>) -> S + Send + 'static,
) -> impl Future<Output = Result<T, StoreError>>
where
    T: Send + 'static,
    E: Into<StoreError> + Send + 'static,
    S: Future<Output = ()> + Send + 'static,
{
    let (answer, answered) = oneshot::channel();
    ledger.settle_later(async move {
        let outcome = match tokio::time::timeout(LATE_LIMIT, call).await {
            Ok(outcome) => outcome.map_err(Into::into),
            Err(_) => Err(StoreUnavailable(format!("no answer within {LATE_LIMIT:?}")).into()),
        };
        match outcome {
            Ok(value) => {
                if let Err(unheard) = answer.send(Ok(value)) {
                    settle(unheard).await;
                }
            }
            Err(error) => {
                settle(Err(error.clone())).await;
                let _ = answer.send(Err(error));
            }
        }
    });
    async move {
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Failed(
                "store call stopped before answering".into(),
            ))
        })
    }
}

/// Runs `futures` together and answers their outputs in order. Each is first
/// polled in order, so decisions that queue for a group statement on their
/// first poll queue in that order.
pub(crate) async fn all_at_once<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use chrono::Utc;

    use super::*;
    use crate::metrics::STORE_OPERATIONS;

    const ALL: [Operation; 17] = [
        Operation::Reserve,
        Operation::Admit,
        Operation::TakeSlots,
        Operation::ClaimWork,
        Operation::WorkBacklog,
        Operation::EnqueueWork,
        Operation::GetWork,
        Operation::FinishWork,
        Operation::ReleaseLease,
        Operation::HoldLease,
        Operation::Settle,
        Operation::AdaptCadence,
        Operation::ShareStream,
        Operation::ReadCatalog,
        Operation::ChangeCatalog,
        Operation::ReadHistory,
        Operation::Readiness,
    ];

    fn shell_with(budget: Duration) -> (Shell, Metrics, DbClock) {
        let (metrics, clock) = (Metrics::new(), DbClock::default());
        let shell = Shell::new(metrics.clone(), clock.clone(), Ledger::default(), budget);
        (shell, metrics, clock)
    }

    fn sample(metrics: &Metrics, series: &str) -> String {
        let text = metrics.encode();
        let line = text.lines().find(|l| l.starts_with(&format!("{series} ")));
        let value = line.and_then(|l| l.rsplit(' ').next());
        value
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .to_string()
    }

    fn errors(metrics: &Metrics, operation: Operation) -> String {
        let label = operation.label();
        let series = format!(r#"quota_arbiter_store_errors_total{{operation="{label}"}}"#);
        sample(metrics, &series)
    }

    fn timed(metrics: &Metrics) -> String {
        sample(metrics, "quota_arbiter_reserve_duration_seconds_count")
    }

    fn reading() -> ClockReading {
        let now = Utc::now();
        ClockReading {
            db_now: now,
            window_start: now - chrono::Duration::minutes(1),
            window_end: now + chrono::Duration::minutes(59),
        }
    }

    fn reservation() -> Reservation {
        Reservation {
            clock: reading(),
            windows: Vec::new(),
            spent: Some(1),
            refusal: None,
            lease: None,
            further: Vec::new(),
        }
    }

    fn take() -> Take {
        Take {
            clock: reading(),
            taken: 2,
            windows: Vec::new(),
            stopped_by: None,
        }
    }

    async fn never<T>() -> Result<T, sqlx::Error> {
        std::future::pending().await
    }

    #[test]
    fn every_operation_has_its_own_label_with_a_series_from_start_up() {
        let labels: Vec<&str> = ALL.iter().map(|o| o.label()).collect();
        for label in &labels {
            assert!(STORE_OPERATIONS.contains(label), "{label}");
        }
        let mut distinct = labels.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), labels.len(), "{labels:?}");
    }

    #[test]
    fn a_store_out_of_reach_is_unavailable_a_failed_statement_is_not() {
        let unreachable = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(matches!(unreachable, StoreError::Unavailable(_)));
        let failed = StoreError::from(sqlx::Error::RowNotFound);
        assert!(matches!(failed, StoreError::Failed(_)));
    }

    #[tokio::test]
    async fn an_answer_in_time_keeps_its_clock_and_a_decision_its_time() {
        let (shell, metrics, clock) = shell_with(Duration::from_secs(5));
        let answer = async { Ok::<_, sqlx::Error>(reservation()) };
        let reserved = shell.run(Operation::Reserve, answer).await.unwrap();
        assert_eq!(clock.window_start(), Some(reserved.clock.window_start));
        assert_eq!(timed(&metrics), "1");
        assert_eq!(errors(&metrics, Operation::Reserve), "0");

        // Not a decision: no time measured, the clock kept all the same.
        let (shell, metrics, clock) = shell_with(Duration::from_secs(5));
        let read = shell.run(Operation::ReadHistory, async {
            Ok::<_, sqlx::Error>(reading())
        });
        let read = read.await.unwrap();
        assert_eq!(clock.window_start(), Some(read.window_start));
        assert_eq!(timed(&metrics), "0");
    }

    #[tokio::test]
    async fn a_take_keeps_its_clock_and_its_time() {
        let (shell, metrics, clock) = shell_with(Duration::from_secs(5));
        let took = shell.run(Operation::TakeSlots, async { Ok::<_, sqlx::Error>(take()) });
        let took = took.await.unwrap();
        assert_eq!(clock.window_start(), Some(took.clock.window_start));
        assert_eq!(timed(&metrics), "1");
    }

    #[tokio::test]
    async fn no_answer_in_time_is_unavailable_and_counted_under_its_operation() {
        let (shell, metrics, clock) = shell_with(Duration::from_millis(50));
        let late = shell.run(Operation::TakeSlots, never::<Take>()).await;
        assert!(matches!(late, Err(StoreError::Unavailable(_))), "{late:?}");
        assert_eq!(errors(&metrics, Operation::TakeSlots), "1");
        assert_eq!(errors(&metrics, Operation::Reserve), "0");
        assert_eq!(timed(&metrics), "0");
        assert_eq!(clock.window_start(), None);
    }

    #[tokio::test]
    async fn a_failed_statement_is_counted_and_stays_a_failure() {
        let (shell, metrics, _) = shell_with(Duration::from_secs(5));
        let failed = async { Err::<(), _>(sqlx::Error::RowNotFound) };
        let failed = shell.run(Operation::EnqueueWork, failed).await;
        assert!(matches!(failed, Err(StoreError::Failed(_))), "{failed:?}");
        assert_eq!(errors(&metrics, Operation::EnqueueWork), "1");
    }

    /// A group's waiter: the leader's call counted its own failure; only a
    /// wait that runs out is counted again.
    #[tokio::test]
    async fn a_wait_counts_running_out_not_a_failure_it_relays() {
        let (shell, metrics, _) = shell_with(Duration::from_millis(100));
        let relayed = async { Err::<(), _>(StoreError::Failed("the leader's".into())) };
        let relayed = shell.wait(Operation::ClaimWork, relayed).await;
        assert!(matches!(relayed, Err(StoreError::Failed(_))), "{relayed:?}");
        assert_eq!(errors(&metrics, Operation::ClaimWork), "0");
        let never = std::future::pending::<Result<(), StoreError>>();
        let ran_out = shell.wait(Operation::ClaimWork, never).await;
        assert!(
            matches!(ran_out, Err(StoreError::Unavailable(_))),
            "{ran_out:?}"
        );
        assert_eq!(errors(&metrics, Operation::ClaimWork), "1");
        let soon = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, StoreError>(7)
        };
        assert_eq!(shell.wait(Operation::ClaimWork, soon).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn calls_of_one_budget_share_it() {
        let budget = Duration::from_millis(800);
        let (shell, _, _) = shell_with(budget);
        let nap = || async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok::<_, sqlx::Error>(())
        };
        // Each call on its own budget has time enough.
        shell.run(Operation::ClaimWork, nap()).await.unwrap();
        shell.run(Operation::ClaimWork, nap()).await.unwrap();
        let one = shell.one_budget();
        one.run(Operation::ClaimWork, nap()).await.unwrap();
        let second = one.run(Operation::ClaimWork, nap()).await;
        assert!(
            matches!(second, Err(StoreError::Unavailable(_))),
            "{second:?}"
        );
    }

    /// What a detached call's settling got (slots taken), once it ran.
    type Settled = Arc<Mutex<Vec<Result<i64, StoreError>>>>;

    fn settling() -> (
        Settled,
        impl FnOnce(Result<Take, StoreError>) -> std::future::Ready<()> + Send + 'static,
    ) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let record = got.clone();
        let settle = move |unused: Result<Take, StoreError>| {
            record.lock().unwrap().push(unused.map(|t| t.taken));
            std::future::ready(())
        };
        (got, settle)
    }

    /// What was settled, once something was (within a second).
    async fn settled(got: &Settled) -> Vec<Result<i64, StoreError>> {
        for _ in 0..100 {
            if !got.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        got.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn a_detached_answer_in_time_goes_to_the_caller_only() {
        let (shell, metrics, clock) = shell_with(Duration::from_secs(5));
        let (got, settle) = settling();
        let call = async { Ok::<_, sqlx::Error>(take()) };
        let took = shell.run_detached(Operation::TakeSlots, call, settle);
        assert_eq!(took.await.unwrap().taken, 2);
        assert!(clock.window_start().is_some());
        assert_eq!(timed(&metrics), "1");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(got.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_detached_answer_too_late_is_settled() {
        let (shell, metrics, _) = shell_with(Duration::from_millis(50));
        let (got, settle) = settling();
        let (release, released) = oneshot::channel::<()>();
        let call = async move {
            let _ = released.await;
            Ok::<_, sqlx::Error>(take())
        };
        let late = shell.run_detached(Operation::TakeSlots, call, settle).await;
        assert!(matches!(late, Err(StoreError::Unavailable(_))), "{late:?}");
        assert_eq!(errors(&metrics, Operation::TakeSlots), "1");
        release.send(()).unwrap();
        let got = settled(&got).await;
        assert!(matches!(got[..], [Ok(2)]), "{got:?}");
    }

    #[tokio::test]
    async fn a_detached_failure_is_settled_and_heard() {
        let (shell, metrics, _) = shell_with(Duration::from_secs(5));
        let (got, settle) = settling();
        let call = async { Err::<Take, _>(sqlx::Error::PoolClosed) };
        let failed = shell.run_detached(Operation::TakeSlots, call, settle).await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        assert_eq!(errors(&metrics, Operation::TakeSlots), "1");
        let got = got.lock().unwrap();
        assert!(
            matches!(got[..], [Err(StoreError::Unavailable(_))]),
            "{got:?}"
        );
    }

    /// A claim's wait for its share of a group's take: the take's failure was
    /// counted by the leader's statement and is only relayed; a wait that runs
    /// out is counted once, and the share that comes later is settled.
    #[tokio::test]
    async fn a_detached_wait_counts_running_out_once_and_settles_the_late_share() {
        let (shell, metrics, _) = shell_with(Duration::from_millis(50));
        let (got, settle) = settling();
        let relayed = async { Err::<Take, _>(StoreError::Failed("the leader's".into())) };
        let relayed = shell
            .wait_detached(Operation::ClaimWork, relayed, settle)
            .await;
        assert!(matches!(relayed, Err(StoreError::Failed(_))), "{relayed:?}");
        assert_eq!(errors(&metrics, Operation::ClaimWork), "0");
        assert!(matches!(got.lock().unwrap()[..], [Err(_)]));

        let (got, settle) = settling();
        let (release, released) = oneshot::channel::<()>();
        let share = async move {
            let _ = released.await;
            Ok::<_, StoreError>(take())
        };
        let late = shell
            .wait_detached(Operation::ClaimWork, share, settle)
            .await;
        assert!(matches!(late, Err(StoreError::Unavailable(_))), "{late:?}");
        assert_eq!(errors(&metrics, Operation::ClaimWork), "1");
        release.send(()).unwrap();
        let got = settled(&got).await;
        assert!(matches!(got[..], [Ok(2)]), "{got:?}");
    }
}
