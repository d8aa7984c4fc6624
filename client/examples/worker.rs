//! A worker that drains a list of jobs through the arbiter: each job asks
//! with `acquire` (waiting out deferrals; the arbiter bypasses it once its
//! deadline is near), calls the upstream, and reports the upstream's status
//! and the grant's lease.
//!
//! ```sh
//! QUOTA_ARBITER_URL=http://127.0.0.1:8080 cargo run -p quota-arbiter-client --example worker
//! ```
//!
//! The upstream here is a stand-in (`call_upstream`): replace it with the
//! real call. A job whose reservation fails (the arbiter unavailable after
//! the client's retries) goes back to the end of the list for a later pass.
//!
//! The fallback: make the flow opt in once (`quota-arbiter flow invoice
//! --fallback local`, or `PATCH /v1/flows/invoice {"fallback": "local"}`).
//! From its first reservation on, the client follows the flow's share of its
//! quota (`GET /v1/stream`); stop the arbiter while this worker runs and the
//! jobs go on at that share, logged `outcome="degraded"`; their upstream
//! statuses, reported as usual, slow the local bucket down on 429s and
//! errors; once the arbiter is back the client reports the degraded slots
//! and its window counts them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use quota_arbiter_client::{Client, Report, Reserve};
use tokio::task::JoinSet;

/// Jobs in flight at once: each holds a slot only while it emits.
const CONCURRENCY: usize = 4;
/// Passes over the jobs that failed before the worker gives up on them.
const PASSES: u32 = 3;

#[derive(Clone, Debug)]
struct Job {
    reference: String,
    flow: &'static str,
    deadline: DateTime<Utc>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let arbiter = Client::from_env()?;
    let mut pending: VecDeque<Job> = jobs().into();
    for pass in 1..=PASSES {
        pending = drain(&arbiter, pending).await;
        if pending.is_empty() {
            break;
        }
        tracing::warn!(pass, left = pending.len(), "jobs left for the next pass");
    }
    // Slots decided locally while the arbiter was down live in this process
    // until the arbiter acknowledges them: give it a moment before exiting.
    let unreported = arbiter.settle_degraded(Duration::from_secs(30)).await;
    if unreported > 0 {
        tracing::error!(unreported, "degraded slots the arbiter will not count");
    }
    if !pending.is_empty() {
        let left: Vec<_> = pending.iter().map(|job| job.reference.as_str()).collect();
        return Err(format!("jobs not done: {left:?}").into());
    }
    Ok(())
}

/// Ten invoices: the first due in 10 minutes (inside the default bypass
/// horizon), the others over the next hours.
fn jobs() -> Vec<Job> {
    let now = Utc::now();
    (0..10)
        .map(|i| Job {
            reference: format!("inv-{}", 40 + i),
            flow: "invoice",
            deadline: now + chrono::Duration::minutes(10 + 30 * i),
        })
        .collect()
}

/// Runs every job once, `CONCURRENCY` at a time; returns those that failed.
async fn drain(arbiter: &Client, mut jobs: VecDeque<Job>) -> VecDeque<Job> {
    let mut running = JoinSet::new();
    let mut failed = VecDeque::new();
    loop {
        while running.len() < CONCURRENCY {
            let Some(job) = jobs.pop_front() else { break };
            let arbiter = arbiter.clone();
            running.spawn(async move { run(&arbiter, &job).await.map_err(|_| job) });
        }
        match running.join_next().await {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(job))) => failed.push_back(job),
            Some(Err(panicked)) => tracing::error!(%panicked, "a job panicked"),
            None => return failed,
        }
    }
}

async fn run(arbiter: &Client, job: &Job) -> Result<(), quota_arbiter_client::Error> {
    let request = Reserve::new(job.flow)
        .deadline(job.deadline)
        .reference(&job.reference);
    let decision = arbiter.acquire(&request).await.inspect_err(|error| {
        tracing::warn!(job = %job.reference, %error, "no decision; the job stays pending");
    })?;
    // `degraded`: the arbiter was unreachable and the flow opted in to the
    // local fallback; the client decided at its share and will report the
    // slot once the arbiter is back. Emit all the same. A job due within the
    // arbiter's bypass horizon is let through at once (`bypassed: true`),
    // never made to wait for a token.
    let outcome = decision.outcome();
    debug_assert!(decision.may_emit(), "acquire returns no deferral");
    let started = Instant::now();
    let status = call_upstream(job).await;
    let report: Report = decision.report().duration(started.elapsed());
    let report = match status {
        Some(status) => report.status(status),
        None => report.timed_out(),
    };
    // A lost report only costs the cadence a lesson and the lease its place
    // until it expires: log it, the job itself is done.
    if let Err(error) = arbiter.report(&report).await {
        tracing::warn!(job = %job.reference, %error, "report not delivered");
    }
    tracing::info!(job = %job.reference, outcome, ?status, "job done");
    Ok(())
}

/// Stand-in for the upstream call: `Some(status)`, or `None` on a timeout.
async fn call_upstream(job: &Job) -> Option<u16> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = job;
    Some(200)
}
