//! The worker's handle on the arbiter: reserve, acquire, report.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use crate::decision::{Decision, DeferralWaits, Reserve};
use crate::error::Error;
use crate::gate;
use crate::report::{Report, ReportAnswer};
use crate::retry::RetryPolicy;
use crate::settings::{parse_url, Pacing, Settings};
use crate::transport::Transport;

/// Longest a single attempt may take; the arbiter answers within its store
/// timeout (1.5 s) or says 503, so this only catches a hung connection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Cheap to clone; clones share the connection pool. Every client of the
/// process talking to the same arbiter shares one cooldown gate, and those
/// with the same pacing one pacing bucket.
#[derive(Clone)]
pub struct Client {
    transport: Arc<Transport>,
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
        }
    }

    /// Asks once for slots (retrying only transient failures): the decision,
    /// a deferral included.
    #[tracing::instrument(skip_all, fields(flow = %request.borrow().flow()))]
    pub async fn reserve(&self, request: impl Borrow<Reserve>) -> Result<Decision, Error> {
        // The one place every decision passes: the local fallback (issue 9,
        // not built yet) would decide here when `error.arbiter_unreachable()`.
        self.transport.post("v1/reserve", request.borrow()).await
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
    #[tracing::instrument(skip_all)]
    pub async fn report(&self, report: &Report) -> Result<ReportAnswer, Error> {
        self.transport.post("v1/report", report).await
    }
}

pub struct ClientBuilder {
    settings: Settings,
    url: Option<String>,
    timeout: Duration,
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
        Ok(Client {
            transport: Arc::new(Transport {
                http,
                base,
                key: self.settings.key,
                retry,
                gates,
                pacer,
            }),
        })
    }
}
