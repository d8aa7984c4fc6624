//! Checks that speed did not cost exactness: over-demand on a budget grants
//! exactly the ceiling, and a cadence quota grants at its rate.

use std::fmt;
use std::time::Duration;

use chrono::Utc;
use quota_arbiter::domain::decision::Outcome;

use crate::drive::{Load, Stop};
use crate::reserve::{self, reserve};

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

impl fmt::Display for OverDemand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.exact() { "exact" } else { "MISMATCH" };
        write!(
            f,
            "over-demand check: asked {}, granted {}, deferred {}, ceiling {} -> {verdict}",
            self.asked, self.granted, self.deferred, self.ceiling
        )
    }
}

/// Four times the ceiling of an enforced flow, asked concurrently.
pub async fn over_demand(load: &Load, flow: &str, ceiling: i64) -> anyhow::Result<OverDemand> {
    let asked = (ceiling.max(1) * 4) as usize;
    let flow = flow.to_string();
    let pick = move || flow.clone();
    let arm = reserve::arm(load, "over-demand", Stop::AfterCalls(asked), pick).await?;
    Ok(OverDemand {
        asked,
        granted: arm.count("granted"),
        deferred: arm.count("deferred"),
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

impl fmt::Display for PacedGrants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cadence check: rate {}/s, burst {}: {} granted in {:.1} s = {:.1} grants/s (ideal {:.1}/s: rate + burst spread over the run)",
            self.rate,
            self.burst,
            self.granted,
            self.seconds,
            self.per_second(),
            self.ideal_per_second()
        )
    }
}

/// Callers ask a cadence quota for the run's duration, each waiting for
/// `retry_at` when deferred, as a worker would: grants per second should
/// match the sustained rate (plus the initial burst).
pub async fn paced_grants(
    load: &Load,
    flow: &str,
    (rate, burst): (f64, f64),
) -> anyhow::Result<PacedGrants> {
    let (client, flow) = (load.client.clone(), flow.to_string());
    let arm = load
        .drive("cadence check", Stop::Elapsed, move |call| {
            let (client, flow) = (client.clone(), flow.clone());
            async move {
                let answer = reserve(&client, call.caller, &flow).await?;
                if answer.outcome != Outcome::Granted {
                    let wait = answer
                        .retry_at
                        .map(|at| (at - Utc::now()).num_milliseconds().clamp(1, 1000))
                        .unwrap_or(10);
                    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                }
                Ok(Some(answer.label()))
            }
        })
        .await?;
    Ok(PacedGrants {
        rate,
        burst,
        granted: arm.count("granted"),
        seconds: arm.seconds(),
    })
}
