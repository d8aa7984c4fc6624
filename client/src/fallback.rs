//! The local fallback (design.md §12, §13): while the arbiter is unreachable,
//! a flow that opted in (`"fallback": "local"`) is decided here, by a token
//! bucket at this client's last known share of its quota, and within this
//! client's part of what each window had left at that share (then of each
//! new window's ceiling): the quota's live clients together never spend more
//! than that. It waits for a token or a window rather than refusing; only a
//! call larger than this client's part of a window, which no wait would let
//! through, is not decided locally. The slots it spends are kept until the
//! arbiter acknowledges them, so its windows count them.

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
use crate::share::{Share, WindowShare};
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
    /// This client's part of each window, as spent locally since the share
    /// they came from (`windows_from`).
    windows: Vec<WindowShare>,
    windows_from: Instant,
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
        for window in &mut self.windows {
            roll(window, now);
        }
    }

    /// When each window has room for `count` (now, or once the window
    /// that lacks it has ended); `None` when some window never will: the
    /// call is larger than this client's part of it.
    fn windows_ready(&self, count: f64, now: Instant) -> Option<Instant> {
        let mut ready = now;
        for window in &self.windows {
            if window.left >= count {
                continue;
            }
            // A new window brings its part, less what due work overspent.
            if window.per_window + window.left.min(0.0) < count {
                return None;
            }
            ready = ready.max(window.ends_at);
        }
        Some(ready)
    }
}

/// A window that has ended gives way to the next, with this client's part of
/// its ceiling; what due work overspent is carried into it.
fn roll(window: &mut WindowShare, now: Instant) {
    while now >= window.ends_at {
        window.left = window.per_window + window.left.min(0.0);
        window.ends_at += window.length.max(Duration::from_millis(1));
    }
}

/// A window as a newer share tells it, less what this client spent of it
/// locally: the arbiter's count lacks the slots not reported yet, so of
/// the same window the smaller part left stands (a share can come while the
/// arbiter decides nothing: its stream up, its store out of reach).
fn less_spent_here(fresh: &WindowShare, kept: &[WindowShare]) -> WindowShare {
    let same = |old: &&WindowShare| {
        let apart = if old.ends_at > fresh.ends_at {
            old.ends_at - fresh.ends_at
        } else {
            fresh.ends_at - old.ends_at
        };
        old.quota == fresh.quota && old.period == fresh.period && apart < Duration::from_secs(1)
    };
    let mut window = fresh.clone();
    if let Some(old) = kept.iter().find(same) {
        window.left = window.left.min(old.left);
    }
    window
}

/// A local call that no wait would let through: larger than this client's
/// part of a window of its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeyondShare;

impl LocalBucket {
    /// A full bucket at `share`, its windows as the share says.
    pub fn new(share: &Share) -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(BucketState {
                share: share.limits,
                factor: share.factor,
                factor_at: now,
                tokens: share.limits.burst,
                refilled_at: now,
                windows: share.windows.clone(),
                windows_from: share.received_at,
            }),
        }
    }

    /// The client's share as the last event told it: its limits bound the
    /// bucket from now on; a newer event's windows (what each had left) and
    /// slow-down replace what was spent locally since the older one.
    pub fn reshare(&self, share: &Share) {
        let mut state = lock(&self.state);
        let now = Instant::now();
        if state.share != share.limits {
            state.refill(now);
            state.share = share.limits;
            state.tokens = state.tokens.min(share.limits.burst);
        }
        if share.received_at > state.windows_from {
            state.refill(now);
            state.windows = share
                .windows
                .iter()
                .map(|fresh| less_spent_here(fresh, &state.windows))
                .collect();
            state.windows_from = share.received_at;
            state.factor = share.factor;
            state.factor_at = now;
            state.refill(now);
        }
    }

    /// Waits until `count` tokens can be taken and every window has room
    /// for `count`, and takes them. A request larger than the bucket waits
    /// for a full bucket and leaves it in debt; one larger than this
    /// client's part of a window is [`BeyondShare`] at once. Cancel-safe:
    /// tokens are taken only when the wait is over, so a dropped call takes
    /// nothing.
    pub async fn take(&self, count: u32) -> Result<(), BeyondShare> {
        let count = f64::from(count.max(1));
        loop {
            let wait = {
                let mut state = lock(&self.state);
                let now = Instant::now();
                state.refill(now);
                let limits = state.in_force(now).limits;
                let needed = count.min(limits.burst);
                let windows = state.windows_ready(count, now).ok_or(BeyondShare)?;
                if state.tokens >= needed && windows <= now {
                    state.tokens -= count;
                    for window in &mut state.windows {
                        window.left -= count;
                    }
                    return Ok(());
                }
                let tokens =
                    Duration::from_secs_f64(((needed - state.tokens) / limits.rate).max(0.0));
                tokens.max(windows - now)
            };
            // Asked again after the wait: a report or a new share may have
            // changed the rate meanwhile.
            sleep(wait.max(Duration::from_micros(100))).await;
        }
    }

    /// Takes `count` tokens now, without waiting: due work, which outranks
    /// the share (design.md §12). A bucket or a window short of them goes
    /// into debt, so the work that can wait pays for it afterwards and the
    /// client stays within its share over time.
    pub fn take_at_once(&self, count: u32) {
        let mut state = lock(&self.state);
        state.refill(Instant::now());
        let count = f64::from(count.max(1));
        state.tokens -= count;
        for window in &mut state.windows {
            window.left -= count;
        }
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

    /// A share of `limits` with `windows` (this client's part of each).
    fn share(limits: Limits, windows: Vec<WindowShare>) -> Share {
        Share {
            quota: "ppf".into(),
            limits,
            factor: 1.0,
            windows,
            received_at: Instant::now(),
            clients: 1,
            fallback: true,
            bypass_horizon: None,
        }
    }

    /// A window with `left` of this client's part, `per_window` in each
    /// next one, ending in `ends_in` seconds, `length` seconds long.
    fn window(left: f64, per_window: f64, ends_in: u64, length: u64) -> WindowShare {
        WindowShare {
            quota: "ppf".into(),
            period: "1m".into(),
            left,
            per_window,
            ends_at: Instant::now() + Duration::from_secs(ends_in),
            length: Duration::from_secs(length),
        }
    }

    fn bucket(limits: Limits) -> LocalBucket {
        LocalBucket::new(&share(limits, Vec::new()))
    }

    async fn times(bucket: &LocalBucket, takes: usize) -> Vec<u128> {
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..takes {
            bucket.take(1).await.unwrap();
            at.push((Instant::now() - start).as_millis());
        }
        at
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_holds_the_spend_to_what_it_had_left_then_to_each_next_ones_part() {
        let fast = Limits {
            rate: 1000.0,
            burst: 1000.0,
        };
        // 5 left of this client's part, 10 in each minute after, the
        // current one ending in 30 s.
        let bucket = LocalBucket::new(&share(fast, vec![window(5.0, 10.0, 30, 60)]));
        let at = times(&bucket, 16).await;
        assert_eq!(at[..5], [0; 5], "what was left, at once");
        assert_eq!(
            at[5..15],
            [30_000; 10],
            "the next minute's part, once it starts"
        );
        assert_eq!(at[15], 90_000, "then the minute after");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_larger_than_a_windows_part_is_beyond_the_share() {
        // 1000 clients on 10 a minute: a hundredth each, never a whole slot.
        let bucket = LocalBucket::new(&share(SHARE, vec![window(0.01, 0.01, 30, 60)]));
        assert_eq!(bucket.take(1).await, Err(BeyondShare));
        let roomy = LocalBucket::new(&share(SHARE, vec![window(3.0, 3.0, 30, 60)]));
        assert_eq!(roomy.take(4).await, Err(BeyondShare));
        assert_eq!(roomy.take(3).await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn due_work_overspends_a_window_and_the_next_one_pays() {
        let fast = Limits {
            rate: 1000.0,
            burst: 1000.0,
        };
        let bucket = LocalBucket::new(&share(fast, vec![window(2.0, 4.0, 10, 60)]));
        for _ in 0..3 {
            bucket.take_at_once(1);
        }
        // One over in this window; the next brings 4, less that one.
        assert_eq!(times(&bucket, 4).await, [10_000, 10_000, 10_000, 70_000]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_share_never_gives_back_what_was_spent_locally() {
        let fast = Limits {
            rate: 1000.0,
            burst: 1000.0,
        };
        let first = share(fast, vec![window(3.0, 3.0, 60, 60)]);
        let bucket = LocalBucket::new(&first);
        times(&bucket, 2).await;
        bucket.reshare(&first);
        sleep(Duration::from_millis(10)).await;
        // The arbiter's count lacks the 2 not reported yet: 3 left, it says
        // of the same window (a few ms on); 1 is what is left.
        let ends = first.windows[0].ends_at;
        let newer = |left: f64, ends_at: Instant| {
            let window = WindowShare {
                left,
                ends_at,
                ..first.windows[0].clone()
            };
            share(fast, vec![window])
        };
        bucket.reshare(&newer(3.0, ends + Duration::from_millis(3)));
        assert_eq!(times(&bucket, 1).await, [0]);
        let waited = tokio::time::timeout(Duration::from_secs(1), bucket.take(1)).await;
        assert!(waited.is_err(), "nothing left of this window");
        // Less left than spent here (others spent too): the share's part.
        let bucket = LocalBucket::new(&first);
        sleep(Duration::from_millis(10)).await;
        bucket.reshare(&newer(1.0, ends));
        assert_eq!(times(&bucket, 1).await, [0]);
        // A share of the next window: its own part.
        sleep(Duration::from_millis(10)).await;
        bucket.reshare(&newer(3.0, ends + Duration::from_secs(60)));
        assert_eq!(times(&bucket, 3).await, [0, 0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_lets_its_burst_through_then_waits_at_its_rate() {
        let bucket = bucket(SHARE);
        assert_eq!(times(&bucket, 5).await, [0, 0, 100, 200, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reported_429_slows_it_and_quiet_time_recovers_it() {
        let bucket = bucket(SHARE);
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
        let bucket = bucket(SHARE);
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
        let bucket = bucket(SHARE);
        times(&bucket, 2).await;
        let cancelled = tokio::time::timeout(Duration::from_millis(50), bucket.take(1)).await;
        assert!(cancelled.is_err());
        // The token refilling since then is still there at 100 ms.
        let start = Instant::now();
        bucket.take(1).await.unwrap();
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
