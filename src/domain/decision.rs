//! The vocabulary of a decision (design.md §2): what a worker asks and what the
//! arbiter answers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::catalog::Mode;
use crate::domain::ratelimit_fields::whole_seconds;
use crate::domain::ClockReading;

/// Largest `count` one reservation may ask for: one business operation that
/// makes several calls, not a bulk import.
pub const MAX_COUNT: i64 = 10_000;
pub use crate::domain::input::MAX_REF_LEN;
pub use crate::domain::{Limit, Outcome};

/// A validated request for `count` slots of a flow's quota.
#[derive(Clone, Debug)]
pub struct SlotRequest {
    pub flow: String,
    pub count: i64,
    pub deadline: Option<DateTime<Utc>>,
    pub reference: Option<String>,
}

impl SlotRequest {
    pub fn new(
        flow: String,
        count: Option<i64>,
        deadline: Option<DateTime<Utc>>,
        reference: Option<String>,
    ) -> Result<Self, String> {
        crate::domain::catalog::validate_name(&flow).map_err(|why| format!("`flow` {why}"))?;
        let count = count.unwrap_or(1);
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(format!("`count` must be between 1 and {MAX_COUNT}"));
        }
        if let Some(reference) = &reference {
            crate::domain::input::reference(reference).map_err(|why| format!("`ref` {why}"))?;
        }
        Ok(Self {
            flow,
            count,
            deadline,
            reference,
        })
    }
}

/// The arbiter's answer. Every business outcome is a decision, never an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    pub outcome: Outcome,
    pub flow: String,
    /// `null` for a flow the arbiter does not know.
    pub quota: Option<String>,
    pub mode: Option<Mode>,
    pub window_start: Option<DateTime<Utc>>,
    /// When the slot can exist (deferred only), by the database clock.
    pub retry_at: Option<DateTime<Utc>>,
    /// Whole seconds until `retry_at`, rounded up; also sent as `Retry-After`.
    pub retry_after_seconds: Option<i64>,
    /// Observe mode: enforcement would have deferred this decision.
    pub would_defer: bool,
    /// What deferred the decision (or would have): budget, cadence or in_flight.
    pub limit: Option<Limit>,
    /// Quotas with `max_in_flight`: the concurrency lease this grant holds;
    /// report it (`POST /v1/report`) when the emission is over. A string of
    /// digits on the wire: 60 random bits do not survive a double.
    #[serde(
        default,
        serialize_with = "crate::domain::input::exact_id::optional_string",
        deserialize_with = "crate::domain::input::exact_id::optional"
    )]
    #[schema(schema_with = crate::domain::input::exact_id::optional_schema)]
    pub lease_id: Option<i64>,
    pub valid_until: Option<DateTime<Utc>>,
    /// The flow's quota as the answer's RateLimit fields describe it
    /// (design.md §4); not part of the body.
    #[serde(skip)]
    pub quota_limit: Option<QuotaLimit>,
}

/// A reservation's quota in the terms of the RateLimit fields: the policy's
/// `q` per hourly window, and what this decision left of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaLimit {
    /// The count the flow's priority may reach in a window.
    pub ceiling: i64,
    /// `None` when no count of the store backs this decision: then nothing
    /// is said about what is left rather than a guess.
    pub left: Option<SlotsLeft>,
}

/// `r` and `t` of the `RateLimit` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotsLeft {
    /// Slots the flow may still reserve (0 on a deferral).
    pub slots: u64,
    /// Seconds until that changes: the window's end; on a deferral, its
    /// `Retry-After`.
    pub reset: u64,
}

/// Windows are one UTC hour (`window_start_of` in the schema).
pub const QUOTA_WINDOW_SECONDS: u64 = 3600;

impl Decision {
    pub fn new(outcome: Outcome, flow: &str) -> Self {
        Self {
            outcome,
            flow: flow.to_string(),
            quota: None,
            mode: None,
            window_start: None,
            retry_at: None,
            retry_after_seconds: None,
            would_defer: false,
            limit: None,
            lease_id: None,
            valid_until: None,
            quota_limit: None,
        }
    }

    /// Names the ceiling the flow's priority may reach: the answer's policy.
    pub fn with_ceiling(mut self, ceiling: i64) -> Self {
        self.quota_limit = Some(QuotaLimit {
            ceiling,
            left: None,
        });
        self
    }

    /// What is left once the window's count is `count_after` (this decision
    /// included), as the store's `clock` read it; nothing when the ceiling
    /// was never named.
    pub fn counted(mut self, count_after: i64, clock: &ClockReading) -> Self {
        if let Some(limit) = &mut self.quota_limit {
            let to_end = (clock.window_end - clock.db_now).num_milliseconds() as f64 / 1e3;
            limit.left = whole_seconds(to_end).map(|reset| SlotsLeft {
                slots: u64::try_from(limit.ceiling - count_after).unwrap_or(0),
                reset,
            });
        }
        self
    }

    /// Deferred for want of room in the window `clock` read: until it ends.
    pub fn deferred_on_budget(self, clock: &ClockReading) -> Self {
        let mut decision = self.deferred_until(clock.window_end, clock.db_now);
        decision.window_start = Some(clock.window_start);
        decision.limit = Some(Limit::Budget);
        decision
    }

    /// A deferral until `retry_at`, given the database's `now`.
    pub fn deferred_until(mut self, retry_at: DateTime<Utc>, db_now: DateTime<Utc>) -> Self {
        let seconds = crate::domain::seconds_rounded_up((retry_at - db_now).num_milliseconds());
        self.outcome = Outcome::Deferred;
        self.retry_at = Some(retry_at);
        self.retry_after_seconds = Some(seconds);
        // Whatever deferred it, nothing is left until Retry-After: the
        // RateLimit field says the same (design.md §4).
        if let Some(limit) = &mut self.quota_limit {
            limit.left = Some(SlotsLeft {
                slots: 0,
                reset: seconds as u64,
            });
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    /// The database clock 1500.25 s before the end of its window.
    fn clock() -> ClockReading {
        let db_now = Utc::now();
        let window_end = db_now + Duration::milliseconds(1_500_250);
        ClockReading {
            db_now,
            window_start: window_end - Duration::hours(1),
            window_end,
        }
    }

    fn left(decision: &Decision) -> Option<SlotsLeft> {
        decision.quota_limit.and_then(|limit| limit.left)
    }

    #[test]
    fn a_counted_grant_leaves_the_ceiling_less_the_count_until_the_window_ends() {
        let granted = Decision::new(Outcome::Granted, "f").with_ceiling(10);
        let counted = granted.counted(3, &clock());
        let expected = SlotsLeft {
            slots: 7,
            reset: 1501,
        };
        assert_eq!(left(&counted), Some(expected), "seconds rounded up");
        let past = Decision::new(Outcome::Granted, "f").with_ceiling(10);
        assert_eq!(left(&past.counted(12, &clock())).unwrap().slots, 0);
        let unnamed = Decision::new(Outcome::Granted, "f").counted(3, &clock());
        assert_eq!(unnamed.quota_limit, None, "no ceiling named, nothing said");
    }

    #[test]
    fn a_deferral_waits_whole_seconds_rounded_up_and_leaves_nothing_till_then() {
        let now = Utc::now();
        let decision = Decision::new(Outcome::Granted, "f").with_ceiling(10);
        let deferred = decision.deferred_until(now + Duration::milliseconds(2_300), now);
        assert_eq!(deferred.outcome, Outcome::Deferred);
        assert_eq!(deferred.retry_after_seconds, Some(3));
        let expected = SlotsLeft { slots: 0, reset: 3 };
        assert_eq!(left(&deferred), Some(expected));
        let exact = Decision::new(Outcome::Granted, "f");
        let exact = exact.deferred_until(now + Duration::seconds(2), now);
        assert_eq!(exact.retry_after_seconds, Some(2), "no second added");
        let past = Decision::new(Outcome::Granted, "f");
        let past = past.deferred_until(now - Duration::seconds(5), now);
        assert_eq!(past.retry_after_seconds, Some(0), "a time past: at once");
    }

    #[test]
    fn a_full_window_defers_until_it_ends() {
        let clock = clock();
        let deferred = Decision::new(Outcome::Granted, "f").deferred_on_budget(&clock);
        assert_eq!(deferred.retry_at, Some(clock.window_end));
        assert_eq!(deferred.retry_after_seconds, Some(1501));
        assert_eq!(deferred.window_start, Some(clock.window_start));
        assert_eq!(deferred.limit, Some(Limit::Budget));
    }
}
