//! The vocabulary of a decision (design.md §2): what a worker asks and what the
//! arbiter answers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use std::collections::BTreeMap;

use crate::domain::catalog::{Mode, QuotaRule, Rule};
use crate::domain::ratelimit_fields::whole_seconds;
use crate::domain::window::{Period, Reopening, WindowCount};
use crate::domain::{ClockReading, FlowName};

/// Largest `count` one reservation may ask for: one business operation that
/// makes several calls, not a bulk import.
pub const MAX_COUNT: i64 = 10_000;
/// Largest estimate one reservation may spend of its quota (`spend`): a
/// quota of tokens counts far more than one of calls.
pub const MAX_SPEND: i64 = 1_000_000_000;
pub use crate::domain::input::MAX_REF_LEN;
pub use crate::domain::{Limit, Outcome};

/// A validated request for `count` slots of a flow's quota.
#[derive(Clone, Debug)]
pub struct SlotRequest {
    pub flow: FlowName,
    pub count: i64,
    pub deadline: Option<DateTime<Utc>>,
    pub reference: Option<String>,
    /// `count` is an estimate to settle to the actual (`POST /v1/settle`):
    /// a grant answers a `reservation_id`.
    pub settle: bool,
    /// What the call spends of the quotas it names (`spend`); a quota of the
    /// flow it does not name is spent `count` (design.md §12).
    pub spend: BTreeMap<String, i64>,
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
            settle: false,
            spend: BTreeMap::new(),
        })
    }

    /// What the call spends of `quota`: its `spend`, else `count`.
    pub fn amount_of(&self, quota: &str) -> i64 {
        self.spend.get(quota).copied().unwrap_or(self.count)
    }

    /// What the call spends of each quota of `rule`, in the rule's order.
    pub fn amounts(&self, rule: &Rule) -> Vec<i64> {
        rule.quotas().map(|q| self.amount_of(&q.name)).collect()
    }

    /// A reservation of an estimate, to be settled to the actual: `spend`
    /// names what it spends of some of the flow's quotas (each up to
    /// [`MAX_SPEND`]), `count` what it spends of each other one. A flow of
    /// one quota spends `spend`'s amount for it as its `count`.
    pub fn estimate(
        flow: String,
        count: Option<i64>,
        spend: BTreeMap<String, i64>,
        deadline: Option<DateTime<Utc>>,
        reference: Option<String>,
    ) -> Result<Self, String> {
        check_amounts(&spend)?;
        let mut request = Self::new(flow, count, deadline, reference)?;
        request.spend = spend;
        request.settle = true;
        Ok(request)
    }
}

/// What a `spend` may name of each quota: 1 to [`MAX_SPEND`] (a reservation's
/// estimate, a work item's).
pub fn check_amounts(spend: &BTreeMap<String, i64>) -> Result<(), String> {
    if spend
        .values()
        .any(|amount| !(1..=MAX_SPEND).contains(amount))
    {
        return Err(format!("`spend` must be between 1 and {MAX_SPEND}"));
    }
    Ok(())
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
    /// A grant of an estimate (`spend` or `"settle": true`): what `POST
    /// /v1/settle` names to settle it to the actual. A string of digits.
    #[serde(
        default,
        serialize_with = "crate::domain::input::exact_id::optional_string",
        deserialize_with = "crate::domain::input::exact_id::optional"
    )]
    #[schema(schema_with = crate::domain::input::exact_id::optional_schema)]
    pub reservation_id: Option<i64>,
    /// A deferral (or would-be deferral) by the budget: the period of the
    /// window that refused; of several, the one that reopens last.
    pub period: Option<String>,
    /// Every window of the flow's quota as this decision left it
    /// (design.md §12); `null` for a flow the arbiter does not know.
    pub windows: Option<Vec<WindowState>>,
    /// The flow's quota as the answer's RateLimit fields describe it
    /// (design.md §4); not part of the body.
    #[serde(skip)]
    pub quota_limit: Option<QuotaLimit>,
    /// The UTC hour of the database clock when decided: decisions are
    /// tallied per hour, whatever the quota's windows; not part of the body.
    #[serde(skip)]
    pub hour_start: Option<DateTime<Utc>>,
}

/// One window of the flow's quota in an answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WindowState {
    pub quota: String,
    /// `1m`, `1h`, `1d`, `1mo` …
    pub period: String,
    pub window_start: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    /// The count the flow's priority may reach in the window.
    pub ceiling: i64,
    /// Slots the flow may still reserve in the window once this decision is
    /// counted; `null` where no count of the store backs the answer.
    pub left: Option<i64>,
}

/// A reservation's quotas in the terms of the RateLimit fields: one policy
/// per window, quota by quota in the flow's order, each quota's windows
/// shortest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaLimit {
    pub windows: Vec<WindowLimit>,
}

/// One window as a RateLimit policy: its `q`, its `w`, and what this
/// decision left of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowLimit {
    /// The quota the window is of.
    pub quota: String,
    /// The policy's name: the quota's for its hour (as before windows
    /// stacked), `quota-period` for any other window (`ppf-1d`).
    pub name: String,
    /// The count the flow's priority may reach in the window.
    pub ceiling: i64,
    /// The window's nominal length in seconds (a month: 30 days).
    pub seconds: u64,
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
    /// A budget deferral: the period of the window that reopens last of
    /// those that refused.
    pub period: Option<Period>,
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
    /// How long the quota's flows typically hold a place (their average
    /// hold time); `None`: no history yet.
    pub typical_hold: Option<chrono::Duration>,
    /// The window that refused (the one that reopens last of those without
    /// room): what a budget deferral waits for; `None`: the clock's hour.
    pub reopening: Option<Reopening>,
}

impl Outlook {
    /// This outlook, with `reopening` the window that refused an ask.
    pub(crate) fn refused_by(self, reopening: Option<Reopening>) -> Self {
        Self { reopening, ..self }
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
    /// A window has too little left: more comes when it ends.
    pub fn budget(reopening: Reopening) -> Self {
        Deferral {
            limit: Limit::Budget,
            retry_at: reopening.at,
            period: Some(reopening.period),
        }
    }

    /// When an ask refused by `limit` could succeed, `tokens` being the
    /// tokens it needs counted from the take's start (its own and those kept
    /// by grants before it): the budget at the window's end, the cadence once
    /// the bucket holds them, the in-flight places when one is expected to
    /// free: after the flows' typical hold time, or when the first lease
    /// expires if that comes sooner (a lease lasts twice the typical hold at
    /// least, so a caller told the expiry would wait beside free places;
    /// none live: now).
    pub fn by(limit: Limit, outlook: &Outlook, tokens: i64) -> Self {
        let retry_at = match limit {
            Limit::Budget => match outlook.reopening {
                Some(window) => return Deferral::budget(window),
                None => outlook.clock.window_end,
            },
            Limit::Cadence => outlook.tokens_at(tokens),
            Limit::InFlight => match (outlook.first_lease_expiry, outlook.typical_hold) {
                (None, _) => outlook.clock.db_now,
                (Some(expiry), None) => expiry,
                (Some(expiry), Some(hold)) => expiry.min(outlook.clock.db_now + hold),
            },
        };
        Deferral {
            limit,
            retry_at,
            period: None,
        }
    }
}

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
            reservation_id: None,
            period: None,
            windows: None,
            quota_limit: None,
            hour_start: None,
        }
    }

    /// Names the ceilings the flow's priority may reach in each window of
    /// `quotas` (the flow's, in its order): the answer's policies.
    pub(crate) fn with_ceilings<'a>(
        mut self,
        quotas: impl IntoIterator<Item = &'a QuotaRule>,
        priority: i16,
    ) -> Self {
        let mut windows = Vec::new();
        for quota in quotas {
            let ceilings = quota.ceilings_for(priority);
            windows.extend(quota.windows.iter().zip(ceilings).map(|(window, ceiling)| {
                WindowLimit {
                    quota: quota.name.clone(),
                    name: if window.period == Period::HOUR {
                        quota.name.clone()
                    } else {
                        window.policy_name(&quota.name)
                    },
                    ceiling,
                    seconds: window.period.nominal_seconds(),
                    left: None,
                }
            }));
        }
        self.quota_limit = Some(QuotaLimit { windows });
        self
    }

    /// The windows as a take found them (`windows`, in the quota's order)
    /// once `spent` more slots are counted in each (this decision's and
    /// those granted before it in its group; `None`: nothing this decision
    /// spent is known): the answer's `window_start` (the hour, else the
    /// shortest window), its `windows`, and what is left of each policy.
    /// `clock` is the database clock the take read.
    pub fn counted_in(
        self,
        windows: &[WindowCount],
        spent: Option<i64>,
        clock: &ClockReading,
    ) -> Self {
        self.counted_across(&[(windows, spent)], clock)
    }

    /// [`Decision::counted_in`] for a call that spent several quotas: each
    /// quota's windows as the take found them and what was spent in them,
    /// in the flow's order of quotas. The answer's `window_start` is its
    /// first quota's.
    pub fn counted_across(
        mut self,
        quotas: &[(&[WindowCount], Option<i64>)],
        clock: &ClockReading,
    ) -> Self {
        self.hour_start = Some(clock.window_start);
        let first = quotas.first().map_or(&[][..], |(windows, _)| *windows);
        let primary = crate::domain::window::primary(first.iter().map(|w| w.period));
        self.window_start = primary
            .and_then(|i| first.get(i))
            .map_or(Some(clock.window_start), |w| Some(w.window_start));
        let Some(limit) = &mut self.quota_limit else {
            return self;
        };
        let counted = quotas
            .iter()
            .flat_map(|(windows, spent)| windows.iter().map(move |w| (w, *spent)));
        let mut states = Vec::with_capacity(limit.windows.len());
        for (policy, (window, spent)) in limit.windows.iter_mut().zip(counted) {
            let left = spent.map(|spent| (policy.ceiling - window.count_before - spent).max(0));
            let to_end = (window.window_end - clock.db_now).num_milliseconds() as f64 / 1e3;
            policy.left = left.and_then(|left| {
                whole_seconds(to_end).map(|reset| SlotsLeft {
                    slots: u64::try_from(left).unwrap_or(0),
                    reset,
                })
            });
            states.push(WindowState {
                quota: policy.quota.clone(),
                period: window.period.to_string(),
                window_start: window.window_start,
                ends_at: window.window_end,
                ceiling: policy.ceiling,
                left,
            });
        }
        self.windows = Some(states);
        self
    }

    /// Deferred by `deferral`'s limit until its retry time, given the
    /// database's `now`.
    pub fn deferred(self, deferral: &Deferral, db_now: DateTime<Utc>) -> Self {
        let mut decision = self.deferred_until(deferral.retry_at, db_now);
        decision.limit = Some(deferral.limit);
        decision.period = deferral.period.map(|p| p.to_string());
        decision
    }

    /// A deferral until `retry_at`, given the database's `now`.
    pub(crate) fn deferred_until(mut self, retry_at: DateTime<Utc>, db_now: DateTime<Utc>) -> Self {
        let seconds = crate::domain::seconds_rounded_up((retry_at - db_now).num_milliseconds());
        self.outcome = Outcome::Deferred;
        self.retry_at = Some(retry_at);
        self.retry_after_seconds = Some(seconds);
        // Whatever deferred it, nothing is left until Retry-After: the
        // RateLimit field says the same of every window (design.md §4).
        if let Some(limit) = &mut self.quota_limit {
            for window in &mut limit.windows {
                window.left = Some(SlotsLeft {
                    slots: 0,
                    reset: seconds as u64,
                });
            }
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
        let limit = decision.quota_limit.as_ref()?;
        limit
            .windows
            .iter()
            .filter_map(|w| w.left)
            .min_by_key(|l| l.slots)
    }

    /// A quota of a minute of 10 and an hour of 100, for a flow of priority 1.
    fn stacked() -> QuotaRule {
        QuotaRule {
            name: "llm".into(),
            windows: vec![
                crate::domain::window::WindowRule {
                    period: Period::parse("1m").unwrap(),
                    ceiling: 10,
                    zone: None,
                },
                crate::domain::window::WindowRule::hour(100),
            ],
            cadence: None,
            max_in_flight: None,
            priority2_share: None,
            priority3_share: None,
        }
    }

    /// The windows as a take found them: the minute at 4, the hour at 50;
    /// the minute ends in 20.5 s, the hour at the clock's window end.
    fn counts(clock: &ClockReading) -> Vec<WindowCount> {
        vec![
            WindowCount {
                period: Period::parse("1m").unwrap(),
                window_start: clock.db_now - Duration::seconds(40),
                window_end: clock.db_now + Duration::milliseconds(20_500),
                ceiling: 10,
                count_before: 4,
            },
            WindowCount {
                period: Period::HOUR,
                window_start: clock.window_start,
                window_end: clock.window_end,
                ceiling: 100,
                count_before: 50,
            },
        ]
    }

    #[test]
    fn a_counted_grant_leaves_each_window_its_ceiling_less_its_count_until_it_ends() {
        let clock = clock();
        let granted = Decision::new(Outcome::Granted, "f")
            .with_ceilings([&stacked()], 1)
            .counted_in(&counts(&clock), Some(3), &clock);
        let limit = granted.quota_limit.clone().unwrap();
        let lefts: Vec<(String, Option<SlotsLeft>)> = limit
            .windows
            .iter()
            .map(|w| (w.name.clone(), w.left))
            .collect();
        assert_eq!(
            lefts,
            [
                (
                    "llm-1m".to_string(),
                    Some(SlotsLeft {
                        slots: 3,
                        reset: 21
                    })
                ),
                (
                    "llm".to_string(),
                    Some(SlotsLeft {
                        slots: 47,
                        reset: 1501
                    })
                ),
            ],
            "seconds rounded up; the hour's policy keeps the quota's name"
        );
        let states = granted.windows.clone().unwrap();
        assert_eq!(states[0].left, Some(3));
        assert_eq!(states[1].period, "1h");
        assert_eq!(granted.window_start, Some(clock.window_start), "the hour's");
        assert_eq!(granted.hour_start, Some(clock.window_start));
        let past = Decision::new(Outcome::Granted, "f")
            .with_ceilings([&stacked()], 1)
            .counted_in(&counts(&clock), Some(12), &clock);
        assert_eq!(left(&past).unwrap().slots, 0);
        let unknown =
            Decision::new(Outcome::Granted, "f").counted_in(&counts(&clock), Some(3), &clock);
        assert_eq!(unknown.quota_limit, None, "no ceiling named, nothing said");
        let uncounted = Decision::new(Outcome::Granted, "f")
            .with_ceilings([&stacked()], 1)
            .counted_in(&counts(&clock), None, &clock);
        assert_eq!(left(&uncounted), None, "no count backs it: nothing said");
        assert_eq!(uncounted.windows.unwrap()[0].left, None);
    }

    #[test]
    fn a_deferral_waits_whole_seconds_rounded_up_and_leaves_nothing_till_then() {
        let now = Utc::now();
        let decision = Decision::new(Outcome::Granted, "f").with_ceilings([&stacked()], 1);
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
            typical_hold: None,
            reopening: None,
        }
    }

    #[test]
    fn each_limit_lifts_at_its_own_time() {
        let outlook = outlook();
        let now = outlook.clock.db_now;
        let budget = Deferral::by(Limit::Budget, &outlook, 5);
        assert_eq!(
            budget.retry_at, outlook.clock.window_end,
            "no window named: the hour"
        );
        let day = Reopening {
            period: Period::parse("1d").unwrap(),
            at: now + Duration::hours(5),
        };
        let by_day = Deferral::by(Limit::Budget, &outlook.refused_by(Some(day)), 5);
        assert_eq!(by_day, Deferral::budget(day));
        assert_eq!((by_day.retry_at, by_day.period), (day.at, Some(day.period)));
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
        // Places are held 1.2 s as a rule: one is expected to free then, not
        // when the first lease (7 s) expires; a hold longer than the wait
        // for the expiry leaves the expiry.
        let typical = Outlook {
            typical_hold: Some(Duration::milliseconds(1200)),
            ..outlook
        };
        let soon = Deferral::by(Limit::InFlight, &typical, 1);
        assert_eq!(soon.retry_at, now + Duration::milliseconds(1200));
        let long = Outlook {
            typical_hold: Some(Duration::seconds(30)),
            ..outlook
        };
        assert_eq!(
            Deferral::by(Limit::InFlight, &long, 1).retry_at,
            now + Duration::seconds(7)
        );
        let no_cadence = Outlook {
            bucket: None,
            first_lease_expiry: None,
            ..outlook
        };
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
    fn a_full_window_defers_until_it_ends_and_names_its_period() {
        let clock = clock();
        let minute = Reopening {
            period: Period::parse("1m").unwrap(),
            at: clock.db_now + Duration::milliseconds(20_500),
        };
        let deferred = Decision::new(Outcome::Granted, "f")
            .with_ceilings([&stacked()], 1)
            .deferred(&Deferral::budget(minute), clock.db_now);
        assert_eq!(deferred.retry_at, Some(minute.at));
        assert_eq!(deferred.retry_after_seconds, Some(21));
        assert_eq!(deferred.limit, Some(Limit::Budget));
        assert_eq!(deferred.period.as_deref(), Some("1m"));
        assert_eq!(
            left(&deferred),
            Some(SlotsLeft {
                slots: 0,
                reset: 21
            })
        );
    }
}
