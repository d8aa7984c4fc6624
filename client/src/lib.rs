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
//! - Not built yet (issue 9, later parts): the local fallback when the
//!   arbiter is unreachable. Such a call fails with [`Error::Unavailable`]
//!   ([`Error::arbiter_unreachable`] tells that case apart); it never
//!   pretends to decide locally.

mod client;
mod decision;
mod error;
mod gate;
mod report;
mod retry;
mod settings;
mod transport;

pub use client::{Client, ClientBuilder, DEFAULT_TIMEOUT};
pub use decision::{
    Decision, DeferralWaits, Limit, Mode, Reserve, MIN_DEFERRAL_WAIT, STALE_DEFERRAL_MAX,
};
pub use error::{Error, Failure};
pub use report::{Report, ReportAnswer};
pub use retry::{parse_retry_after, RetryPolicy};
pub use settings::{Pacing, Settings, DEFAULT_URL};
