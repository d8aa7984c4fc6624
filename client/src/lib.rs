//! The worker client of quota-arbiter: ask before each emission, wait out
//! deferrals, retry what is transient, report what the upstream said.
//!
//! ```no_run
//! # async fn emit() -> Result<(), quota_arbiter_client::Error> {
//! use quota_arbiter_client::{Client, Reserve};
//!
//! let arbiter = Client::from_env()?;
//! let deadline = chrono::Utc::now() + chrono::Duration::hours(2);
//! let decision = arbiter
//!     .acquire(Reserve::new("invoice").count(1).deadline(deadline).reference("inv-42"))
//!     .await?;
//! // ... emit, then tell the arbiter how the upstream answered:
//! arbiter.report(&decision.report().status(200)).await?;
//! # Ok(()) }
//! ```
//!
//! - [`Client::reserve`] asks once and returns the [`Decision`], a deferral
//!   included; [`Client::acquire`] asks until the answer lets the worker emit.
//! - Transient failures (429, 502, 503, 504, connection errors, timeouts) are
//!   retried with the deterministic backoff of [`RetryPolicy`], honouring
//!   `Retry-After`; a `Retry-After` closes the process's cooldown gate for
//!   every call to that arbiter.
//! - The cooldown gate and the optional pacing bucket are process-wide: a
//!   registry keyed by the arbiter's URL, so clones of a client and clients
//!   built apart share them.
//! - The local fallback: a client follows its flows' shares of their quotas
//!   (`GET /v1/stream`, from the first reservation on). When the arbiter is
//!   unreachable ([`Error::arbiter_unreachable`]: connection errors,
//!   timeouts, 503 `store-unavailable`, after the retries), a flow that opted
//!   in (`"fallback": "local"`) is decided by a local token bucket at this
//!   client's share ([`Decision::Degraded`]): it waits for a token, never
//!   refuses; reported upstream statuses adapt it like the arbiter's cadence
//!   ([`adapt`]); its slots are reported to the arbiter once it answers again,
//!   so its window counts them. Other flows fail with [`Error::Unavailable`].

mod adapt;
mod client;
#[cfg(feature = "cli")]
pub mod command;
mod decision;
mod error;
mod fallback;
mod gate;
mod report;
mod retry;
mod settings;
mod share;
mod stream;
mod transport;

pub use adapt::{
    adapt, multiplier, recovered_factor, Adapted, Limits, BURST_FLOOR, RATE_FLOOR,
    RECOVERY_PER_SECOND,
};
pub use client::{Client, ClientBuilder, DEFAULT_TIMEOUT};
pub use decision::{
    Decision, DeferralWaits, LeaseId, Limit, Mode, Reserve, MIN_DEFERRAL_WAIT, STALE_DEFERRAL_MAX,
};
pub use error::{Error, Failure};
pub use report::{Report, ReportAnswer, Settled};
pub use retry::{parse_retry_after, RetryPolicy};
pub use settings::{Pacing, Settings, DEFAULT_URL};
pub use share::Share;
