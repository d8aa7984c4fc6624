//! Checks that speed did not cost exactness: over-demand on a budget grants
//! exactly the ceiling, and a cadence quota grants at its rate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use quota_arbiter::decision::Outcome;

use crate::reserve::reserve;

pub struct OverDemand {
    pub asked: usize,
    pub granted: usize,
    pub deferred: usize,
    pub ceiling: i64,
}

impl OverDemand {
    pub fn exact(&self) -> bool {
        self.granted as i64 == self.ceiling && self.granted + self.deferred == self.asked
    }
}

/// Four times the ceiling of an enforced flow, asked concurrently.
pub async fn over_demand(
    client: &reqwest::Client,
    base: &str,
    flow: &str,
    ceiling: i64,
    concurrency: usize,
) -> anyhow::Result<OverDemand> {
    let asked = (ceiling.max(1) * 4) as usize;
    let next = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, base, flow, next) = (
                client.clone(),
                base.to_string(),
                flow.to_string(),
                next.clone(),
            );
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < asked {
                    outcomes.push(reserve(&client, &base, &flow).await?.outcome);
                }
                anyhow::Ok(outcomes)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for caller in callers {
        outcomes.extend(caller.await??);
    }
    let count = |outcome: Outcome| outcomes.iter().filter(|o| **o == outcome).count();
    Ok(OverDemand {
        asked,
        granted: count(Outcome::Granted),
        deferred: count(Outcome::Deferred),
        ceiling,
    })
}

pub struct PacedGrants {
    pub rate: f64,
    pub burst: f64,
    pub granted: usize,
    pub seconds: f64,
}

impl PacedGrants {
    pub fn per_second(&self) -> f64 {
        self.granted as f64 / self.seconds
    }

    /// What a bucket that starts full grants per second over the run.
    pub fn ideal_per_second(&self) -> f64 {
        self.rate + self.burst / self.seconds
    }
}

/// Callers ask a cadence quota for `duration`, each waiting for `retry_at`
/// when deferred, as a worker would: grants per second should match the
/// sustained rate (plus the initial burst).
pub async fn paced_grants(
    client: &reqwest::Client,
    base: &str,
    flow: &str,
    (rate, burst): (f64, f64),
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<PacedGrants> {
    let started = Instant::now();
    let until = started + duration;
    let callers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, base, flow) = (client.clone(), base.to_string(), flow.to_string());
            tokio::spawn(async move {
                let mut granted = 0;
                while Instant::now() < until {
                    let decision = reserve(&client, &base, &flow).await?;
                    if decision.outcome == Outcome::Granted {
                        granted += 1;
                        continue;
                    }
                    let wait = decision
                        .retry_at
                        .map(|at| (at - Utc::now()).num_milliseconds().clamp(1, 1000))
                        .unwrap_or(10);
                    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                }
                anyhow::Ok(granted)
            })
        })
        .collect();
    let mut granted = 0;
    for caller in callers {
        granted += caller.await??;
    }
    Ok(PacedGrants {
        rate,
        burst,
        granted,
        seconds: started.elapsed().as_secs_f64(),
    })
}
