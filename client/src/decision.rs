//! The arbiter's vocabulary on the wire (design.md §2): what a worker asks
//! (`POST /v1/reserve`), what the arbiter answers, and when a deferred worker
//! asks again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::report::Report;
use crate::retry::RetryPolicy;

/// A grant's concurrency lease, as the arbiter wrote it: an opaque token the
/// client only gives back. The arbiter sends a string of digits (60 random
/// bits, which a JSON number read as a double would round); an integer from
/// an older arbiter is read into the same digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct LeaseId(String);

impl LeaseId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for LeaseId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

impl From<i64> for LeaseId {
    fn from(id: i64) -> Self {
        Self(id.to_string())
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Text(String),
            Whole(i64),
        }
        Ok(match Wire::deserialize(d)? {
            Wire::Text(text) => Self(text),
            Wire::Whole(n) => Self::from(n),
        })
    }
}

/// A request for `count` slots of a flow's quota, all or nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reserve {
    flow: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline: Option<DateTime<Utc>>,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend: Option<std::collections::BTreeMap<String, u64>>,
}

impl Reserve {
    /// One slot of `flow`'s quota (the arbiter's default count).
    pub fn new(flow: impl Into<String>) -> Self {
        Self {
            flow: flow.into(),
            count: None,
            deadline: None,
            reference: None,
            spend: None,
        }
    }

    /// An estimate of what the call spends of `quota`, one of the flow's
    /// (call it for each quota estimated; a quota of the flow not named is
    /// spent [`Reserve::count`]): a grant carries a
    /// [`Decision::reservation_id`] to settle it to the actual once the call
    /// is over ([`crate::Client::settle`]).
    pub fn spend(mut self, quota: impl Into<String>, estimate: u64) -> Self {
        self.spend
            .get_or_insert_with(Default::default)
            .insert(quota.into(), estimate);
        self
    }

    /// Slots to reserve, all or nothing (1-10000; the arbiter checks).
    pub fn count(mut self, count: u32) -> Self {
        self.count = Some(count);
        self
    }

    /// When the work is due: within the arbiter's bypass horizon it is
    /// `bypassed` instead of deferred.
    pub fn deadline(mut self, deadline: DateTime<Utc>) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The caller's reference, echoed in the arbiter's logs.
    pub fn reference(mut self, reference: impl Into<String>) -> Self {
        self.reference = Some(reference.into());
        self
    }

    pub fn flow(&self) -> &str {
        &self.flow
    }

    pub fn deadline_at(&self) -> Option<DateTime<Utc>> {
        self.deadline
    }

    /// Slots asked for (1 unless set; an estimate's, when it fits).
    pub fn slots(&self) -> u32 {
        let estimate = self.spend.as_ref().and_then(|spend| spend.values().next());
        match estimate {
            Some(&estimate) => u32::try_from(estimate).unwrap_or(u32::MAX),
            None => self.count.unwrap_or(1),
        }
    }
}

/// How a flow is treated; new flows observe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    Observe,
    Enforce,
    Count,
    /// A mode this client does not know yet (a newer arbiter).
    #[serde(other)]
    Other,
}

/// Which limit deferred a decision (or, in observe mode, would have).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    /// The hourly window is full: the slot exists when the next one starts.
    Budget,
    /// The token bucket is short: the slot exists when tokens have refilled.
    Cadence,
    /// Every in-flight place is leased: one frees when the first lease expires.
    InFlight,
    /// A limit this client does not know yet (a newer arbiter).
    #[serde(other)]
    Other,
}

/// The arbiter's answer to a reservation, the `outcome` field choosing the
/// variant. Every business outcome is a decision, never an error. Variants are
/// non-exhaustive: match them with `..`, the arbiter may add fields.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Decision {
    /// A slot was reserved (or observe mode, which always grants): emit.
    #[non_exhaustive]
    Granted {
        flow: String,
        quota: Option<String>,
        mode: Option<Mode>,
        window_start: Option<DateTime<Utc>>,
        /// Observe mode: enforcement would have deferred this decision.
        #[serde(default)]
        would_defer: bool,
        /// What would have deferred it, in observe mode.
        limit: Option<Limit>,
        /// Quotas with `max_in_flight`: the lease this grant holds; report it
        /// when the emission is over ([`Decision::report`]).
        lease_id: Option<LeaseId>,
        valid_until: Option<DateTime<Utc>>,
        /// A grant of an estimate ([`Reserve::spend`]): what settles it.
        #[serde(default)]
        reservation_id: Option<LeaseId>,
    },
    /// A limit was reached: keep the work pending and ask again at `retry_at`.
    #[non_exhaustive]
    Deferred {
        flow: String,
        quota: Option<String>,
        mode: Option<Mode>,
        window_start: Option<DateTime<Utc>>,
        /// When the slot can exist, by the database clock.
        retry_at: DateTime<Utc>,
        /// Whole seconds until `retry_at` when the arbiter decided, rounded up.
        retry_after_seconds: Option<i64>,
        limit: Option<Limit>,
    },
    /// Deadline work that outranks the quota, counted after the fact: emit.
    #[non_exhaustive]
    Bypassed {
        flow: String,
        quota: Option<String>,
        mode: Option<Mode>,
        window_start: Option<DateTime<Utc>>,
    },
    /// Never throttled (an unknown flow, or one in `count` mode): emit.
    #[non_exhaustive]
    Unthrottled {
        flow: String,
        quota: Option<String>,
        mode: Option<Mode>,
    },
    /// Decided by this client, not the arbiter: the arbiter was unreachable
    /// and the flow opted in to the local fallback (design.md §12), which
    /// took `count` tokens of this client's share of `quota`: emit. The
    /// client reports these slots to the arbiter once it answers again.
    #[non_exhaustive]
    #[serde(skip)]
    Degraded {
        flow: String,
        quota: String,
        count: u32,
        /// The work was due within the arbiter's bypass horizon: it took its
        /// tokens at once instead of waiting for them, as the arbiter would
        /// have bypassed it. Reported as such, tallied `bypassed`.
        bypassed: bool,
    },
}

impl Decision {
    /// The outcome as the API names it (`degraded`: the client's own).
    pub fn outcome(&self) -> &'static str {
        match self {
            Decision::Granted { .. } => "granted",
            Decision::Deferred { .. } => "deferred",
            Decision::Bypassed { .. } => "bypassed",
            Decision::Unthrottled { .. } => "unthrottled",
            Decision::Degraded { .. } => "degraded",
        }
    }

    /// Whether the worker may emit now (everything but a deferral).
    pub fn may_emit(&self) -> bool {
        !matches!(self, Decision::Deferred { .. })
    }

    /// The slots a degraded decision took locally.
    pub fn count(&self) -> Option<u32> {
        match self {
            Decision::Degraded { count, .. } => Some(*count),
            _ => None,
        }
    }

    pub fn flow(&self) -> &str {
        match self {
            Decision::Granted { flow, .. }
            | Decision::Deferred { flow, .. }
            | Decision::Bypassed { flow, .. }
            | Decision::Unthrottled { flow, .. }
            | Decision::Degraded { flow, .. } => flow,
        }
    }

    /// The concurrency lease a grant holds, to free when the emission is over.
    pub fn lease_id(&self) -> Option<&LeaseId> {
        match self {
            Decision::Granted { lease_id, .. } => lease_id.as_ref(),
            _ => None,
        }
    }

    /// A grant of an estimate: what settles it to the actual
    /// ([`crate::Client::settle`]).
    pub fn reservation_id(&self) -> Option<&LeaseId> {
        match self {
            Decision::Granted { reservation_id, .. } => reservation_id.as_ref(),
            _ => None,
        }
    }

    /// The report of this decision's emission: its flow and lease; add the
    /// upstream's status and the emission's duration.
    pub fn report(&self) -> Report {
        let report = Report::flow(self.flow());
        match self.lease_id() {
            Some(lease_id) => report.lease(lease_id.clone()),
            None => report,
        }
    }
}

/// The least wait after a deferral whose `retry_at` had already passed; each
/// such deferral in a row doubles it, up to [`STALE_DEFERRAL_MAX`]. An arbiter
/// answering "deferred, retry now" again and again (a lease that just expired,
/// or a bug) must not turn a worker into a busy loop.
pub const MIN_DEFERRAL_WAIT: Duration = Duration::from_millis(50);
pub const STALE_DEFERRAL_MAX: Duration = Duration::from_secs(5);

/// How long a deferred worker waits before asking again, deferral after
/// deferral of one `acquire`.
#[derive(Debug, Default)]
pub struct DeferralWaits {
    /// Deferrals in a row whose `retry_at` had passed when they arrived.
    stale: u32,
}

impl DeferralWaits {
    /// The wait before asking again after a deferral until `retry_at`.
    ///
    /// `retry_at` is by the database clock and `retry_after_seconds` is the
    /// same moment relative to the decision, rounded up to whole seconds. The
    /// local clock's reading of `retry_at` keeps the millisecond precision
    /// cadence deferrals need; the relative seconds bound it, so a skewed
    /// local clock costs at most a second instead of hammering or
    /// oversleeping. Work with a deadline never sleeps past it: at the
    /// deadline the arbiter bypasses it.
    pub fn next(
        &mut self,
        retry_at: DateTime<Utc>,
        retry_after_seconds: Option<i64>,
        deadline: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Duration {
        let until = |t: DateTime<Utc>| (t - now).to_std().unwrap_or(Duration::ZERO);
        let mut wait = until(retry_at);
        if let Some(seconds) = retry_after_seconds {
            let upper = Duration::from_secs(seconds.max(0) as u64);
            let lower = upper.saturating_sub(Duration::from_secs(1));
            wait = wait.clamp(lower, upper);
        }
        if let Some(deadline) = deadline {
            wait = wait.min(until(deadline));
        }
        self.stale = if wait < MIN_DEFERRAL_WAIT {
            self.stale.saturating_add(1)
        } else {
            0
        };
        let floor = RetryPolicy {
            attempts: u32::MAX,
            base: MIN_DEFERRAL_WAIT,
            max: STALE_DEFERRAL_MAX,
        };
        wait.max(floor.wait_before_retry(self.stale, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_790_000_000, 0).unwrap() + chrono::Duration::milliseconds(seconds)
    }

    #[test]
    fn reserve_serializes_as_the_arbiter_reads_it() {
        let deadline = Utc.with_ymd_and_hms(2026, 11, 30, 14, 30, 0).unwrap();
        let body = Reserve::new("invoice")
            .count(3)
            .deadline(deadline)
            .reference("inv-42");
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"flow": "invoice", "count": 3,
                "deadline": "2026-11-30T14:30:00Z", "ref": "inv-42"})
        );
        assert_eq!(
            serde_json::to_value(Reserve::new("invoice")).unwrap(),
            serde_json::json!({"flow": "invoice"})
        );
    }

    #[test]
    fn decisions_read_as_the_arbiter_writes_them() {
        // The README's and design.md's examples, as `src/decision.rs` writes them.
        let granted: Decision = serde_json::from_str(
            r#"{"outcome":"granted","flow":"invoice","quota":"ppf","mode":"observe",
            "window_start":"2026-11-30T14:00:00Z","retry_at":null,"retry_after_seconds":null,
            "would_defer":true,"limit":"budget","lease_id":"733927340619428183",
            "valid_until":"2026-11-30T14:00:30Z"}"#,
        )
        .unwrap();
        let Decision::Granted {
            mode,
            would_defer,
            limit,
            lease_id,
            ..
        } = &granted
        else {
            panic!("{granted:?}")
        };
        assert_eq!(
            (
                *mode,
                *would_defer,
                *limit,
                lease_id.as_ref().map(LeaseId::as_str)
            ),
            (
                Some(Mode::Observe),
                true,
                Some(Limit::Budget),
                Some("733927340619428183")
            )
        );
        assert_eq!(
            granted.report().lease_id().map(LeaseId::as_str),
            Some("733927340619428183")
        );
        // An older arbiter's integer reads into the same digits.
        let older: LeaseId = serde_json::from_str("733927340619428183").unwrap();
        assert_eq!(older.as_str(), "733927340619428183");

        let deferred: Decision = serde_json::from_str(
            r#"{"outcome":"deferred","flow":"invoice","quota":"ppf","mode":"enforce",
            "window_start":"2026-11-30T14:00:00Z","retry_at":"2026-11-30T15:00:00Z",
            "retry_after_seconds":1800,"would_defer":false,"limit":"in_flight",
            "lease_id":null,"valid_until":null}"#,
        )
        .unwrap();
        let Decision::Deferred {
            retry_at, limit, ..
        } = &deferred
        else {
            panic!("{deferred:?}")
        };
        assert_eq!(
            *retry_at,
            Utc.with_ymd_and_hms(2026, 11, 30, 15, 0, 0).unwrap()
        );
        assert_eq!(*limit, Some(Limit::InFlight));
        assert!(!deferred.may_emit());

        let unknown: Decision = serde_json::from_str(
            r#"{"outcome":"unthrottled","flow":"nobody","quota":null,"mode":"someday"}"#,
        )
        .unwrap();
        assert!(matches!(
            unknown,
            Decision::Unthrottled {
                mode: Some(Mode::Other),
                ..
            }
        ));
        assert!(unknown.may_emit());
        assert!(serde_json::from_str::<Decision>(r#"{"outcome":"maybe","flow":"x"}"#).is_err());
        // Only the client decides `degraded`; the arbiter never says it.
        let local = r#"{"outcome":"degraded","flow":"x","quota":"q","count":1}"#;
        assert!(serde_json::from_str::<Decision>(local).is_err());
    }

    fn once(
        retry_at: DateTime<Utc>,
        seconds: Option<i64>,
        deadline: Option<DateTime<Utc>>,
    ) -> Duration {
        DeferralWaits::default().next(retry_at, seconds, deadline, at(0))
    }

    #[test]
    fn a_deferral_is_waited_by_retry_at_within_the_relative_seconds() {
        // Clocks agree: millisecond precision.
        assert_eq!(once(at(1_300), Some(2), None), Duration::from_millis(1_300));
        // The local clock runs 10 s behind the database: capped by the seconds.
        assert_eq!(once(at(11_300), Some(2), None), Duration::from_secs(2));
        // 10 s ahead: retry_at looks past, the seconds still make it wait.
        assert_eq!(once(at(-8_700), Some(2), None), Duration::from_secs(1));
        // Without the seconds, the local reading alone.
        assert_eq!(once(at(500), None, None), Duration::from_millis(500));
    }

    #[test]
    fn a_deferral_is_never_waited_past_the_deadline() {
        let deadline = Some(at(90_000));
        assert_eq!(
            once(at(3_600_000), Some(3600), deadline),
            Duration::from_secs(90)
        );
        let past = Some(at(-5_000));
        assert_eq!(once(at(3_600_000), Some(3600), past), MIN_DEFERRAL_WAIT);
    }

    #[test]
    fn deferrals_to_a_passed_retry_at_back_off_until_a_real_one_comes() {
        let mut waits = DeferralWaits::default();
        let stale: Vec<u128> = (0..9)
            .map(|_| waits.next(at(-3), Some(0), None, at(0)).as_millis())
            .collect();
        assert_eq!(stale, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // A real wait resets the escalation: sub-second cadence waits stay exact.
        assert_eq!(
            waits.next(at(120), Some(1), None, at(0)),
            Duration::from_millis(120)
        );
        assert_eq!(waits.next(at(0), Some(0), None, at(0)), MIN_DEFERRAL_WAIT);
    }
}
