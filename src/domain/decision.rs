//! The vocabulary of a decision (design.md §2): what a worker asks and what the
//! arbiter answers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::catalog::Mode;
use crate::domain::ratelimit_fields::whole_seconds;
use crate::domain::{ClockReading, FlowName};

/// Largest `count` one reservation may ask for: one business operation that
/// makes several calls, not a bulk import.
pub const MAX_COUNT: i64 = 10_000;
pub use crate::domain::input::MAX_REF_LEN;
pub use crate::domain::{Limit, Outcome};

/// A validated request for `count` slots of a flow's quota.
#[derive(Clone, Debug)]
pub struct SlotRequest {
    pub flow: FlowName,
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
        let flow = FlowName::parse(flow).map_err(|why| format!("`flow` {why}"))?;
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

/// What refused a reservation (or, in observe mode, would have), and when it
/// could succeed: the deferral's answer. Which limit refuses is rationing's
/// (`crate::domain::rationing`); when it lifts is [`Deferral::by`]; how an
/// answer carries it is [`Decision::deferred`]. Those three are the whole of
/// what a deferred caller is told (docs/design.md §9).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deferral {
    pub limit: Limit,
    pub retry_at: DateTime<Utc>,
}

/// What a take read of when each limit lifts, by the database clock: the
/// window's end, the token bucket as the take found it, the in-flight
/// places' first expiry. The store reports these facts; the rule that turns
/// them into a retry time is [`Deferral::by`].
#[derive(Clone, Copy, Debug)]
pub struct Outlook {
    pub clock: ClockReading,
    /// The bucket when the take began: its tokens and the rate (per second)
    /// they refill at; `None` without a cadence.
    pub bucket: Option<(f64, f64)>,
    /// When the earliest live lease of the quota expires; `None`: none is live.
    pub first_lease_expiry: Option<DateTime<Utc>>,
}

impl Outlook {
    /// Only the window is known (a budget-only quota).
    pub(crate) fn of_window(clock: ClockReading) -> Self {
        Self {
            clock,
            bucket: None,
            first_lease_expiry: None,
        }
    }

    /// Whole tokens in the bucket when the take began; `None` without a cadence.
    pub fn tokens(&self) -> Option<i64> {
        self.bucket.map(|(tokens, _)| tokens.floor() as i64)
    }

    /// When the bucket will have refilled to `tokens`, counted from the
    /// take's start (sub-second, by the database clock); now without a
    /// cadence.
    fn tokens_at(&self, tokens: i64) -> DateTime<Utc> {
        let Some((before, rate)) = self.bucket else {
            return self.clock.db_now;
        };
        let seconds = ((tokens as f64 - before) / rate).max(0.0);
        self.clock.db_now + chrono::Duration::microseconds((seconds * 1e6).ceil() as i64)
    }
}

impl Deferral {
    /// The window (as `clock` read it) has too little left: more comes when
    /// it ends.
    pub fn budget(clock: &ClockReading) -> Self {
        Deferral::by(Limit::Budget, &Outlook::of_window(*clock), 0)
    }

    /// When an ask refused by `limit` could succeed, `tokens` being the
    /// tokens it needs counted from the take's start (its own and those kept
    /// by grants before it): the budget at the window's end, the cadence once
    /// the bucket holds them, the in-flight places when the first lease
    /// expires (a report may free one sooner; none live: now).
    pub fn by(limit: Limit, outlook: &Outlook, tokens: i64) -> Self {
        let retry_at = match limit {
            Limit::Budget => outlook.clock.window_end,
            Limit::Cadence => outlook.tokens_at(tokens),
            Limit::InFlight => outlook.first_lease_expiry.unwrap_or(outlook.clock.db_now),
        };
        Deferral { limit, retry_at }
    }
}

/// Windows are one UTC hour (`window_start_of` in the schema).
pub(crate) const QUOTA_WINDOW_SECONDS: u64 = 3600;

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
    pub(crate) fn with_ceiling(mut self, ceiling: i64) -> Self {
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
    pub(crate) fn deferred_on_budget(self, clock: &ClockReading) -> Self {
        let mut decision = self.deferred(&Deferral::budget(clock), clock.db_now);
        decision.window_start = Some(clock.window_start);
        decision
    }

    /// Deferred by `deferral`'s limit until its retry time, given the
    /// database's `now`.
    pub fn deferred(self, deferral: &Deferral, db_now: DateTime<Utc>) -> Self {
        let mut decision = self.deferred_until(deferral.retry_at, db_now);
        decision.limit = Some(deferral.limit);
        decision
    }

    /// A deferral until `retry_at`, given the database's `now`.
    pub(crate) fn deferred_until(mut self, retry_at: DateTime<Utc>, db_now: DateTime<Utc>) -> Self {
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

    /// A take that found 2.5 tokens refilling at 4 a second, and a first
    /// lease 7 s from expiry.
    fn outlook() -> Outlook {
        let clock = clock();
        Outlook {
            clock,
            bucket: Some((2.5, 4.0)),
            first_lease_expiry: Some(clock.db_now + Duration::seconds(7)),
        }
    }

    #[test]
    fn each_limit_lifts_at_its_own_time() {
        let outlook = outlook();
        let now = outlook.clock.db_now;
        let budget = Deferral::by(Limit::Budget, &outlook, 5);
        assert_eq!(budget.retry_at, outlook.clock.window_end);
        assert_eq!(budget, Deferral::budget(&outlook.clock));
        // 5 tokens from 2.5 at 4/s: 0.625 s.
        let cadence = Deferral::by(Limit::Cadence, &outlook, 5);
        assert_eq!(cadence.retry_at, now + Duration::milliseconds(625));
        assert_eq!(cadence.limit, Limit::Cadence);
        let held = Deferral::by(Limit::Cadence, &outlook, 2);
        assert_eq!(held.retry_at, now, "tokens already there: at once");
        let places = Deferral::by(Limit::InFlight, &outlook, 1);
        assert_eq!(places.retry_at, now + Duration::seconds(7));
        let none_live = Outlook {
            first_lease_expiry: None,
            ..outlook
        };
        let free = Deferral::by(Limit::InFlight, &none_live, 1);
        assert_eq!(free.retry_at, now, "no live lease: a place is free now");
        let no_cadence = Outlook::of_window(outlook.clock);
        assert_eq!(no_cadence.tokens(), None);
        assert_eq!(outlook.tokens(), Some(2));
        assert_eq!(Deferral::by(Limit::Cadence, &no_cadence, 3).retry_at, now);
    }

    #[test]
    fn a_deferred_answer_names_its_limit_and_time() {
        let outlook = outlook();
        let now = outlook.clock.db_now;
        let places = Deferral::by(Limit::InFlight, &outlook, 1);
        let deferred = Decision::new(Outcome::Granted, "f").deferred(&places, now);
        assert_eq!(deferred.outcome, Outcome::Deferred);
        assert_eq!(deferred.limit, Some(Limit::InFlight));
        assert_eq!(deferred.retry_at, Some(now + Duration::seconds(7)));
        assert_eq!(deferred.retry_after_seconds, Some(7));
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
