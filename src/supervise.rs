//! The replica's background tasks outlive their own panics (docs/design.md
//! §9): a task that panics is logged, counted under its name
//! (`quota_arbiter_background_restarts_total{task}`) and started again after
//! a backoff that doubles from 1 s to 30 s, and starts over at 1 s once a run
//! lasted a minute. Spawned once and left alone, a panicked catalog sync or
//! listener would leave the replica serving with a catalog and a key ring
//! that never change again: a flip to enforce or a revoked key never obeyed.
//!
//! A task that returns has ended on purpose (the tally flush told to stop,
//! pruning with nothing to prune, the bootstrap done) and is not started
//! again. Failures a task handles itself (a store out of reach) stay its
//! own: it logs them and tries again on its next tick.

use std::any::Any;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::Metrics;

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const LONGEST_BACKOFF: Duration = Duration::from_secs(30);
/// A run this long was a healthy one: the next panic waits the first backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Runs `run()` as a task of its own, and again after each panic. Aborting
/// the handle aborts the task it runs.
pub(crate) fn supervise<F, Fut>(task: &'static str, metrics: Metrics, run: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    metrics.count_background_restarts(task);
    tokio::spawn(supervised(task, metrics, run))
}

async fn supervised<F, Fut>(task: &'static str, metrics: Metrics, mut run: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let Err(panic) = Running(tokio::spawn(run())).finish().await else {
            return;
        };
        if started.elapsed() >= HEALTHY_RUN {
            backoff = FIRST_BACKOFF;
        }
        metrics.record_background_restart(task);
        tracing::error!(task, %panic, ?backoff, "background task panicked; starting it again");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LONGEST_BACKOFF);
    }
}

/// A running task, aborted when this is dropped: stopping the supervisor
/// stops what it supervises.
struct Running(JoinHandle<()>);

impl Running {
    /// `Err` with the panic's message when the task panicked.
    async fn finish(mut self) -> Result<(), String> {
        match (&mut self.0).await {
            Ok(()) => Ok(()),
            Err(error) if error.is_panic() => Err(panic_message(error.into_panic())),
            // Cancelled: the runtime is shutting down.
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "a panic without a message".into(), |m| m.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn restarts(metrics: &Metrics, task: &str) -> String {
        let text = metrics.encode();
        let prefix = format!("quota_arbiter_background_restarts_total{{task=\"{task}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix).map(String::from))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
    }

    type Run = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

    /// A task that panics on its first `panics` runs, then keeps running.
    fn flaky(runs: Arc<AtomicUsize>, panics: usize) -> impl FnMut() -> Run {
        move || {
            let run = runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                assert!(run >= panics, "run {run} fails, as it was told to");
                std::future::pending::<()>().await
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicked_task_runs_again_after_a_doubling_backoff_and_is_counted() {
        let metrics = Metrics::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let panics = 3;
        let handle = supervise("catalog_sync", metrics.clone(), flaky(runs.clone(), panics));
        assert_eq!(restarts(&metrics, "catalog_sync"), "0", "created at zero");
        let started = Instant::now();
        // Paused time: a minute passes at once if nothing restarts the task.
        while runs.load(Ordering::SeqCst) <= panics && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            panics + 1,
            "started again after each panic"
        );
        // 1 s, then 2 s, then 4 s of backoff before the fourth run.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(7) && waited < Duration::from_secs(8),
            "{waited:?}"
        );
        assert_eq!(restarts(&metrics, "catalog_sync"), "3");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            panics + 1,
            "a healthy run stays"
        );
        handle.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_returns_has_ended_and_is_not_started_again() {
        let metrics = Metrics::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let handle = supervise("tally_flush", metrics.clone(), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        });
        handle.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(restarts(&metrics, "tally_flush"), "0");
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_the_supervisor_stops_its_task() {
        struct Alive(Arc<AtomicUsize>);
        impl Drop for Alive {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let alive = Arc::new(AtomicUsize::new(0));
        let counted = alive.clone();
        let handle = supervise("prune", Metrics::new(), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let guard = Alive(counted.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(alive.load(Ordering::SeqCst), 1);
        handle.abort();
        let _ = handle.await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(alive.load(Ordering::SeqCst), 0, "the task went with it");
    }

    #[test]
    fn a_panics_message_is_read_whatever_its_type() {
        assert_eq!(panic_message(Box::new("static")), "static");
        assert_eq!(panic_message(Box::new(String::from("owned"))), "owned");
        assert_eq!(panic_message(Box::new(7)), "a panic without a message");
    }
}
