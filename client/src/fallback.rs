//! The local fallback (design.md §12): while the arbiter is unreachable, a
//! flow that opted in (`"fallback": "local"`) is decided here, by a token
//! bucket at this client's last known share of its quota. It never refuses:
//! it waits for a token. The slots it spends are kept until the arbiter
//! acknowledges them, so its window counts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::{sleep, Instant};

use crate::adapt::{adapt, Adapted, Limits};
use crate::error::Error;
use crate::gate::lock;
use crate::retry::RetryPolicy;
use crate::transport::Transport;

/// A quota's local token bucket. Its ceiling is the client's share, which
/// the stream may change at any time; upstream reports adapt a factor of it.
pub struct LocalBucket {
    state: Mutex<BucketState>,
}

struct BucketState {
    share: Limits,
    factor: f64,
    factor_at: Instant,
    tokens: f64,
    refilled_at: Instant,
}

impl BucketState {
    /// The limits in force now (the factor recovered, not stored).
    fn in_force(&self, now: Instant) -> Adapted {
        adapt(self.share, self.factor, now - self.factor_at, None)
    }

    fn refill(&mut self, now: Instant) {
        let limits = self.in_force(now).limits;
        let elapsed = (now - self.refilled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limits.rate).min(limits.burst);
        self.refilled_at = now;
    }
}

impl LocalBucket {
    /// A full bucket at `share`.
    pub fn new(share: Limits) -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(BucketState {
                share,
                factor: 1.0,
                factor_at: now,
                tokens: share.burst,
                refilled_at: now,
            }),
        }
    }

    /// The stream told a new share: it bounds the bucket from now on.
    pub fn reshare(&self, share: Limits) {
        let mut state = lock(&self.state);
        if state.share != share {
            let now = Instant::now();
            state.refill(now);
            state.share = share;
            state.tokens = state.tokens.min(share.burst);
        }
    }

    /// Waits until `count` tokens can be taken, and takes them. A request
    /// larger than the bucket waits for a full bucket and leaves it in debt.
    /// Cancel-safe: tokens are taken only when the wait is over, so a
    /// dropped call takes nothing.
    pub async fn take(&self, count: u32) {
        let count = f64::from(count.max(1));
        loop {
            let wait = {
                let mut state = lock(&self.state);
                let now = Instant::now();
                state.refill(now);
                let limits = state.in_force(now).limits;
                let needed = count.min(limits.burst);
                if state.tokens >= needed {
                    state.tokens -= count;
                    return;
                }
                Duration::from_secs_f64((needed - state.tokens) / limits.rate)
            };
            // Asked again after the wait: a report or a new share may have
            // changed the rate meanwhile.
            sleep(wait.max(Duration::from_micros(100))).await;
        }
    }

    /// Takes `count` tokens now, without waiting: due work, which outranks
    /// the share (design.md §12). A bucket short of them goes into debt, so
    /// the work that can wait pays for it afterwards and the client stays
    /// within its share over time.
    pub fn take_at_once(&self, count: u32) {
        let mut state = lock(&self.state);
        state.refill(Instant::now());
        state.tokens -= f64::from(count.max(1));
    }

    /// An upstream status reported during the fallback adapts the bucket;
    /// the limits in force after it.
    pub fn report(&self, status: u16) -> Adapted {
        let mut state = lock(&self.state);
        let now = Instant::now();
        state.refill(now);
        let adapted = adapt(
            state.share,
            state.factor,
            now - state.factor_at,
            Some(status),
        );
        state.factor = adapted.factor;
        state.factor_at = now;
        state.tokens = state.tokens.min(adapted.limits.burst);
        adapted
    }

    pub fn in_force(&self) -> Adapted {
        lock(&self.state).in_force(Instant::now())
    }
}

/// Whether work due at `deadline` is within the arbiter's bypass horizon
/// at `now`: the arbiter's own rule (work due within the horizon, or past
/// due, outranks the quota), applied by the client's clock.
pub fn is_due(
    deadline: Option<DateTime<Utc>>,
    horizon: Option<Duration>,
    now: DateTime<Utc>,
) -> bool {
    let (Some(deadline), Some(horizon)) = (deadline, horizon) else {
        return false;
    };
    chrono::Duration::from_std(horizon).is_ok_and(|horizon| deadline - now <= horizon)
}

/// Since when, and until when, the arbiter is taken for unreachable: until
/// `next_probe`, calls of flows that opted in are decided locally without
/// asking it; then one call asks it once (a probe).
#[derive(Clone, Copy, Debug)]
pub struct Outage {
    pub probes: u32,
    pub next_probe: Instant,
}

/// How a call goes, given the outage.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Ask the arbiter, retrying transient failures.
    Arbiter,
    /// The arbiter is taken for unreachable and it is time to check: ask once.
    Probe,
    /// The arbiter is taken for unreachable: decide locally.
    Local,
}

#[derive(Default)]
pub struct OutageWatch {
    outage: Mutex<Option<Outage>>,
}

impl OutageWatch {
    /// The route of a call of a flow that may fall back. One caller at a time
    /// probes; the others decide locally meanwhile.
    pub fn route(&self, retry: &RetryPolicy) -> Route {
        let mut outage = lock(&self.outage);
        match outage.as_mut() {
            None => Route::Arbiter,
            Some(o) if Instant::now() < o.next_probe => Route::Local,
            Some(o) => {
                o.next_probe = Instant::now() + retry.wait_before_retry(o.probes + 1, None);
                Route::Probe
            }
        }
    }

    /// The arbiter answered: every call asks it again.
    pub fn ended(&self) {
        if lock(&self.outage).take().is_some() {
            tracing::info!("quota arbiter reachable again; local fallback over");
        }
    }

    /// A call found the arbiter unreachable: the next probe waits a backoff
    /// longer than the last (deterministic, like every retry).
    pub fn confirmed(&self, retry: &RetryPolicy) {
        let mut outage = lock(&self.outage);
        let probes = outage.map_or(0, |o| o.probes) + 1;
        if probes == 1 {
            tracing::warn!("quota arbiter unreachable; flows with fallback decide locally");
        }
        *outage = Some(Outage {
            probes,
            next_probe: Instant::now() + retry.wait_before_retry(probes, None),
        });
    }

    pub fn is_on(&self) -> bool {
        lock(&self.outage).is_some()
    }
}

/// Degraded slots not yet acknowledged by the arbiter, by flow. A reporter
/// task sends them with the client's backoff until the arbiter takes them; it
/// outlives the client if it must (never lost while the process lives).
#[derive(Default)]
pub struct Unreported {
    by_flow: Mutex<HashMap<String, Spent>>,
    reporting: AtomicBool,
}

/// What a flow's local decisions spent: slots, and how many of the
/// decisions were due work let through at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Spent {
    slots: u64,
    bypasses: u64,
}

/// `POST /v1/report` with the degraded slots of a flow.
#[derive(Serialize)]
struct DegradedReport<'a> {
    flow: &'a str,
    degraded: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    bypassed: Option<u32>,
}

/// Most slots one report carries: the arbiter's limit.
const MAX_PER_REPORT: u64 = 1_000_000;

impl Unreported {
    /// Keeps a local decision of `count` slots of `flow` (`bypassed`: due
    /// work let through at once) and makes sure a reporter runs.
    pub fn add(
        self: &Arc<Self>,
        flow: &str,
        count: u32,
        bypassed: bool,
        transport: &Arc<Transport>,
    ) {
        {
            let mut by_flow = lock(&self.by_flow);
            let spent = by_flow.entry(flow.to_string()).or_default();
            spent.slots += u64::from(count);
            spent.bypasses += u64::from(bypassed);
        }
        if !self.reporting.swap(true, Ordering::AcqRel) {
            tokio::spawn(report_degraded(self.clone(), transport.clone()));
        }
    }

    /// Slots of `flow` still to acknowledge.
    pub fn of(&self, flow: &str) -> u64 {
        lock(&self.by_flow).get(flow).map_or(0, |spent| spent.slots)
    }

    pub fn total(&self) -> u64 {
        lock(&self.by_flow).values().map(|spent| spent.slots).sum()
    }

    /// The next report: a flow's slots and bypasses, at most the arbiter's
    /// limit of each.
    fn next(&self) -> Option<(String, Spent)> {
        let by_flow = lock(&self.by_flow);
        let (flow, spent) = by_flow.iter().find(|(_, spent)| spent.slots > 0)?;
        let part = Spent {
            slots: spent.slots.min(MAX_PER_REPORT),
            bypasses: spent.bypasses.min(MAX_PER_REPORT),
        };
        Some((flow.clone(), part))
    }

    fn acknowledged(&self, flow: &str, part: Spent) {
        let mut by_flow = lock(&self.by_flow);
        if let Some(left) = by_flow.get_mut(flow) {
            left.slots = left.slots.saturating_sub(part.slots);
            left.bypasses = left.bypasses.saturating_sub(part.bypasses);
            if left.slots == 0 {
                by_flow.remove(flow);
            }
        }
    }
}

/// Sends degraded slots, one attempt at a time with the client's backoff
/// between failures (its `Retry-After` and cooldown too), until none is left.
async fn report_degraded(unreported: Arc<Unreported>, transport: Arc<Transport>) {
    let mut failures = 0;
    loop {
        let Some((flow, part)) = unreported.next() else {
            unreported.reporting.store(false, Ordering::Release);
            // Slots added between the look and the flag: take them on.
            if unreported.next().is_some() && !unreported.reporting.swap(true, Ordering::AcqRel) {
                continue;
            }
            return;
        };
        let report = DegradedReport {
            flow: &flow,
            // Both at most MAX_PER_REPORT, a u32.
            degraded: part.slots as u32,
            bypassed: (part.bypasses > 0).then_some(part.bypasses as u32),
        };
        let n = report.degraded;
        match transport
            .post_attempts::<_, serde_json::Value>("v1/report", &report, 1)
            .await
        {
            Ok(_) => {
                tracing::info!(%flow, slots = n, "degraded slots counted by the arbiter");
                unreported.acknowledged(&flow, part);
                failures = 0;
            }
            // The arbiter read and refused them (the flow was deleted
            // meanwhile): asking again would not change its mind.
            Err(Error::Refused { status, detail, .. }) if (400..500).contains(&status) => {
                tracing::error!(%flow, slots = n, status, %detail,
                    "degraded slots refused by the arbiter; not counted");
                unreported.acknowledged(&flow, part);
            }
            Err(error) => {
                failures += 1;
                let wait = transport.retry.wait_before_retry(failures, None);
                tracing::debug!(%flow, slots = n, %error, wait_ms = wait.as_millis() as u64,
                    "degraded slots not delivered yet");
                sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARE: Limits = Limits {
        rate: 10.0,
        burst: 2.0,
    };

    async fn times(bucket: &LocalBucket, takes: usize) -> Vec<u128> {
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..takes {
            bucket.take(1).await;
            at.push((Instant::now() - start).as_millis());
        }
        at
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_lets_its_burst_through_then_waits_at_its_rate() {
        let bucket = LocalBucket::new(SHARE);
        assert_eq!(times(&bucket, 5).await, [0, 0, 100, 200, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reported_429_slows_it_and_quiet_time_recovers_it() {
        let bucket = LocalBucket::new(SHARE);
        times(&bucket, 2).await;
        let slowed = bucket.report(429);
        assert!((slowed.limits.rate - 7.0).abs() < 1e-9);
        // 1/7 s apart now (tokio's timer rounds each wait up to the millisecond).
        assert_eq!(times(&bucket, 3).await, [143, 286, 429]);
        sleep(Duration::from_secs(120)).await;
        let recovered = bucket.in_force();
        assert!(
            (recovered.factor - (0.7 * 1.005f64.powi(120)).min(1.0)).abs() < 1e-6,
            "{recovered:?}"
        );
        sleep(Duration::from_secs(3600)).await;
        assert_eq!(bucket.in_force().limits, SHARE);
    }

    #[tokio::test(start_paused = true)]
    async fn due_work_goes_at_once_and_the_rest_pays_for_it() {
        let bucket = LocalBucket::new(SHARE);
        times(&bucket, 2).await;
        // Empty: three due decisions go now, leaving the bucket 3 in debt...
        for _ in 0..3 {
            bucket.take_at_once(1);
        }
        // ...which the next wait repays at 10/s: 400 ms for the next token.
        assert_eq!(times(&bucket, 2).await, [400, 500]);
    }

    #[test]
    fn due_is_the_arbiters_rule_within_the_horizon_or_past() {
        let now = Utc::now();
        let horizon = Some(Duration::from_secs(900));
        let at = |seconds: i64| Some(now + chrono::Duration::seconds(seconds));
        assert!(is_due(at(900), horizon, now));
        assert!(is_due(at(-60), horizon, now));
        assert!(!is_due(at(901), horizon, now));
        assert!(!is_due(None, horizon, now));
        // An arbiter that did not tell its horizon: nothing is due.
        assert!(!is_due(at(0), None, now));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_take_takes_nothing() {
        let bucket = LocalBucket::new(SHARE);
        times(&bucket, 2).await;
        let cancelled = tokio::time::timeout(Duration::from_millis(50), bucket.take(1)).await;
        assert!(cancelled.is_err());
        // The token refilling since then is still there at 100 ms.
        let start = Instant::now();
        bucket.take(1).await;
        assert_eq!((Instant::now() - start).as_millis(), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn the_outage_probes_after_a_growing_backoff() {
        let retry = RetryPolicy {
            attempts: 3,
            base: Duration::from_secs(1),
            max: Duration::from_secs(4),
        };
        let watch = OutageWatch::default();
        assert_eq!(watch.route(&retry), Route::Arbiter);
        watch.confirmed(&retry);
        assert_eq!(watch.route(&retry), Route::Local);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(watch.route(&retry), Route::Probe);
        // Another caller meanwhile decides locally: one probe at a time.
        assert_eq!(watch.route(&retry), Route::Local);
        watch.confirmed(&retry);
        sleep(Duration::from_millis(1_999)).await;
        assert_eq!(watch.route(&retry), Route::Local);
        sleep(Duration::from_millis(1)).await;
        assert_eq!(watch.route(&retry), Route::Probe);
        watch.ended();
        assert_eq!(watch.route(&retry), Route::Arbiter);
    }
}
