//! The worker's handle on the arbiter: reserve, acquire, report; and the
//! local fallback when the arbiter is unreachable (design.md §12).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;

use crate::decision::{Decision, DeferralWaits, LeaseId, Reserve};
use crate::error::Error;
use crate::fallback::{is_due, LocalBucket, OutageWatch, Route, Unreported};
use crate::gate::{self, lock};
use crate::report::{Report, ReportAnswer, Settled};
use crate::retry::RetryPolicy;
use crate::settings::{parse_url, Pacing, Settings};
use crate::share::Share;
use crate::stream::{Follower, StreamTarget};
use crate::transport::Transport;

/// Longest a single attempt may take; the arbiter answers within its store
/// timeout (1.5 s) or says 503, so this only catches a hung connection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Cheap to clone; clones share the connection pool, the share stream and
/// the local fallback. Every client of the process talking to the same
/// arbiter shares one cooldown gate, and those with the same pacing one
/// pacing bucket.
///
/// The share stream (`GET /v1/stream`) starts with the first reservation and
/// follows every flow the client has reserved for since: a flow's share is
/// known from its first call on, so the fallback can take over whenever the
/// arbiter goes away later. [`ClientBuilder::share_stream`] turns it off (a
/// one-shot command, like the CLI's `reserve`): then nothing falls back.
#[derive(Clone)]
pub struct Client {
    transport: Arc<Transport>,
    local: Arc<Local>,
}

/// The local fallback's state, one per client and its clones.
struct Local {
    /// `None`: no share stream, no fallback.
    follower: Option<Follower>,
    /// One bucket per quota: the client's flows of a quota share its share.
    buckets: Mutex<HashMap<String, Arc<LocalBucket>>>,
    outage: OutageWatch,
    unreported: Arc<Unreported>,
}

/// Where a flow's fallback decides: its quota and that quota's bucket.
struct LocalShare {
    quota: String,
    bucket: Arc<LocalBucket>,
    bypass_horizon: Option<Duration>,
}

impl Client {
    /// A client configured by the `QUOTA_*` variables (see [`Settings`]);
    /// a broken value is logged and replaced by its default.
    pub fn from_env() -> Result<Self, Error> {
        Self::builder().settings(Settings::from_env()).build()
    }

    /// A client with the defaults (not the environment), to adjust.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            settings: Settings::default(),
            url: None,
            timeout: DEFAULT_TIMEOUT,
            share_stream: true,
        }
    }

    /// Asks once for slots (retrying only transient failures): the decision,
    /// a deferral included.
    ///
    /// When the arbiter is unreachable ([`Error::arbiter_unreachable`]) and
    /// the flow opted in to the local fallback and its share is known, the
    /// decision is [`Decision::Degraded`]: taken from this client's share,
    /// waiting for a token if need be (never refused). Until the next probe
    /// (the client's backoff, doubling) such flows are then decided locally
    /// at once, without asking the arbiter; the probe asks it once.
    #[tracing::instrument(skip_all, fields(flow = %request.borrow().flow()))]
    pub async fn reserve(&self, request: impl Borrow<Reserve>) -> Result<Decision, Error> {
        let request = request.borrow();
        if let Some(follower) = &self.local.follower {
            follower.follow(request.flow());
        }
        let retry = &self.transport.retry;
        let route = match self.local_share(request.flow()) {
            Some(_) => self.local.outage.route(retry),
            None => Route::Arbiter,
        };
        let answer = match route {
            Route::Local => {
                if let Some(local) = self.local_share(request.flow()) {
                    if let Some(decision) = self.decide_locally(request, local).await {
                        return Ok(decision);
                    }
                    // Beyond this client's part of a window: only the
                    // arbiter can decide it; ask it once.
                    self.transport.post_attempts("v1/reserve", request, 1).await
                } else {
                    self.transport.post("v1/reserve", request).await
                }
            }
            Route::Probe => self.transport.post_attempts("v1/reserve", request, 1).await,
            Route::Arbiter => self.transport.post("v1/reserve", request).await,
        };
        match answer {
            Err(error) if error.arbiter_unreachable() => {
                // Read again: the share may have come during the retries.
                let Some(local) = self.local_share(request.flow()) else {
                    return Err(error);
                };
                self.local.outage.confirmed(retry);
                tracing::warn!(%error, "deciding locally");
                match self.decide_locally(request, local).await {
                    Some(decision) => Ok(decision),
                    None => Err(error),
                }
            }
            // Unavailable but reachable (429s, 502s): the outage stands as it is.
            Err(error @ Error::Unavailable { .. }) => Err(error),
            // Any answer, a refusal included: the arbiter is there.
            answer => {
                self.local.outage.ended();
                answer
            }
        }
    }

    /// A degraded decision: tokens of the flow's share within this client's
    /// part of each window, waited for, or taken at once for work due within
    /// the arbiter's bypass horizon (it would have bypassed it: urgent work
    /// is never held back); its slots kept until the arbiter counts them.
    /// `None` for a call larger than this client's part of a window, which
    /// no wait would let through. Cancel-safe: a call dropped while waiting
    /// took nothing.
    async fn decide_locally(&self, request: &Reserve, local: LocalShare) -> Option<Decision> {
        let count = request.slots();
        let bypassed = is_due(request.deadline_at(), local.bypass_horizon, Utc::now());
        if bypassed {
            local.bucket.take_at_once(count);
        } else if local.bucket.take(count).await.is_err() {
            return None;
        }
        self.local
            .unreported
            .add(request.flow(), count, bypassed, &self.transport);
        Some(Decision::Degraded {
            flow: request.flow().to_string(),
            quota: local.quota,
            count,
            bypassed,
        })
    }

    /// The flow's share and bucket, if it opted in and its share is known.
    fn local_share(&self, flow: &str) -> Option<LocalShare> {
        let share = self.share(flow).filter(|share| share.fallback)?;
        Some(self.bucket_of(share))
    }

    fn bucket_of(&self, share: Share) -> LocalShare {
        let bucket = lock(&self.local.buckets)
            .entry(share.quota.clone())
            .or_insert_with(|| Arc::new(LocalBucket::new(&share)))
            .clone();
        bucket.reshare(&share);
        LocalShare {
            quota: share.quota,
            bucket,
            bypass_horizon: share.bypass_horizon,
        }
    }

    /// The flow's share as the last `share` event told it, once the stream
    /// has received one (the flow reserved for at least once).
    pub fn share(&self, flow: &str) -> Option<Share> {
        self.local.follower.as_ref()?.shares.of(flow)
    }

    /// The flow's degraded slots the arbiter has not acknowledged yet.
    pub fn unreported(&self, flow: &str) -> u64 {
        self.local.unreported.of(flow)
    }

    /// Waits (up to `within`) until the arbiter has acknowledged every
    /// degraded slot of this client; the slots still unreported. A worker
    /// about to exit calls it: slots are kept in memory only.
    pub async fn settle_degraded(&self, within: Duration) -> u64 {
        let until = tokio::time::Instant::now() + within;
        loop {
            let left = self.local.unreported.total();
            if left == 0 || tokio::time::Instant::now() >= until {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asks until the answer is not a deferral: granted, bypassed (the
    /// arbiter's call once the deadline is near) or unthrottled. Deferred
    /// asks wait for `retry_at` ([`DeferralWaits`]), never past the deadline.
    ///
    /// Cancel-safe: dropping the future abandons the wait or the request in
    /// flight and leaves nothing running. (A reservation the arbiter made for
    /// a request abandoned in flight stays counted, like any unused grant.)
    #[tracing::instrument(skip_all, fields(flow = %request.borrow().flow()))]
    pub async fn acquire(&self, request: impl Borrow<Reserve>) -> Result<Decision, Error> {
        let request = request.borrow();
        let mut waits = DeferralWaits::default();
        loop {
            let decision = self.reserve(request).await?;
            let Decision::Deferred {
                retry_at,
                retry_after_seconds,
                limit,
                ..
            } = &decision
            else {
                return Ok(decision);
            };
            let wait = waits.next(
                *retry_at,
                *retry_after_seconds,
                request.deadline_at(),
                Utc::now(),
            );
            tracing::debug!(?limit, %retry_at, wait_ms = wait.as_millis() as u64, "deferred");
            tokio::time::sleep(wait).await;
        }
    }

    /// Reports an emission's upstream status and/or frees its lease
    /// (`POST /v1/report`). Retried like a reservation: a retry after a
    /// timeout may count the status twice in the adaptive cadence.
    ///
    /// During the local fallback (the arbiter unreachable) a report about a
    /// flow decided locally adapts the local bucket instead, with the
    /// arbiter's coefficients ([`crate::multiplier`]), and is not sent; the
    /// answer says so ([`ReportAnswer::local`]). A lease is then not
    /// released: it expires on its own.
    /// Settles a grant of an estimate ([`Reserve::spend`]) to what the call
    /// actually spent of `quota` (its other quotas: as estimated): what was
    /// over-estimated goes back to the quota's windows still open, what was
    /// under-estimated is counted without refusal. Once, within the
    /// arbiter's `settle_within`; [`Settled::of`] tells what it did to
    /// `quota`.
    #[tracing::instrument(skip_all)]
    pub async fn settle(
        &self,
        reservation_id: &LeaseId,
        quota: &str,
        spent: u64,
    ) -> Result<Settled, Error> {
        let body = serde_json::json!({
            "reservation_id": reservation_id.as_str(),
            "spent": { quota: spent },
        });
        self.transport.post("v1/settle", &body).await
    }

    #[tracing::instrument(skip_all)]
    pub async fn report(&self, report: &Report) -> Result<ReportAnswer, Error> {
        let local = match (report.flow_name(), report.quota_name()) {
            (Some(flow), _) => self.local_share(flow),
            (None, Some(quota)) => self
                .local
                .follower
                .as_ref()
                .and_then(|follower| follower.shares.of_quota(quota))
                .filter(|share| share.fallback)
                .map(|share| self.bucket_of(share)),
            (None, None) => None,
        };
        let Some(local) = local else {
            return self.transport.post("v1/report", report).await;
        };
        if !self.local.outage.is_on() {
            match self.transport.post("v1/report", report).await {
                Err(error) if error.arbiter_unreachable() => {
                    self.local.outage.confirmed(&self.transport.retry);
                }
                answer => return answer,
            }
        }
        let adapted = match report.upstream_status() {
            Some(status) => local.bucket.report(status),
            None => local.bucket.in_force(),
        };
        Ok(ReportAnswer {
            factor: Some(adapted.factor),
            effective_rate: Some(adapted.limits.rate),
            effective_burst: Some(adapted.limits.burst),
            local: true,
            ..ReportAnswer::default()
        })
    }
}

pub struct ClientBuilder {
    settings: Settings,
    url: Option<String>,
    timeout: Duration,
    share_stream: bool,
}

impl ClientBuilder {
    /// Everything at once, as [`Settings::from_env`] reads it.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The arbiter's base URL (checked by [`ClientBuilder::build`]).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Sent as `Authorization: Bearer`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.settings.key = Some(key.into());
        self
    }

    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.settings.retry = retry;
        self
    }

    /// Local pacing of requests to the arbiter; a rate of 0 disables it.
    pub fn pacing(mut self, rate: f64, burst: u32) -> Self {
        self.settings.pacing = (rate > 0.0).then_some(Pacing {
            rate,
            burst: burst.max(1),
        });
        self
    }

    /// Longest one attempt may take before it counts as a timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether the client follows its flows' shares (`GET /v1/stream`, on by
    /// default, from the first reservation): without it the client counts as
    /// no live client of the quotas and nothing falls back locally.
    pub fn share_stream(mut self, on: bool) -> Self {
        self.share_stream = on;
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        let mut base = match &self.url {
            Some(url) => parse_url(url).map_err(Error::Setup)?,
            None => self.settings.url,
        };
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let http = reqwest::Client::builder()
            .timeout(self.timeout)
            .build()
            .map_err(|why| Error::Setup(why.to_string()))?;
        let gates = gate::for_arbiter(&base);
        let pacer = self.settings.pacing.map(|pacing| gates.pacer(pacing));
        let retry = RetryPolicy {
            attempts: self.settings.retry.attempts.max(1),
            ..self.settings.retry
        };
        let follower = if self.share_stream {
            let target = StreamTarget::new(&base, self.settings.key.clone(), retry, self.timeout)
                .map_err(Error::Setup)?;
            Some(Follower::new(target))
        } else {
            None
        };
        Ok(Client {
            transport: Arc::new(Transport {
                http,
                base,
                key: self.settings.key,
                retry,
                gates,
                pacer,
            }),
            local: Arc::new(Local {
                follower,
                buckets: Mutex::default(),
                outage: OutageWatch::default(),
                unreported: Arc::default(),
            }),
        })
    }
}
