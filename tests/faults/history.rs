//! The record of every request and answer, and what it must show once the
//! faults are over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use quota_arbiter::domain::decision::{Decision, Outcome};

/// What a caller asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The enforced budget flow.
    Enforced,
    /// An enforced flow, always due within the bypass horizon.
    Due,
    /// The observed flow.
    Observed,
    /// The count-mode flow.
    Counted,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Enforced, Kind::Due, Kind::Observed, Kind::Counted];

    /// Counted after the fact: what a SIGKILL may lose (the last flush interval).
    fn after_the_fact(self) -> bool {
        self != Kind::Enforced
    }

    /// The quota the flow spends.
    pub fn quota(self) -> &'static str {
        match self {
            Kind::Enforced => "budget",
            Kind::Due => "deadline",
            Kind::Observed | Kind::Counted => "feed",
        }
    }
}

#[derive(Clone, Debug)]
pub enum Answer {
    Decided {
        outcome: Outcome,
        window_start: Option<DateTime<Utc>>,
    },
    Failed {
        status: u16,
        content_type: String,
        problem_type: String,
        retry_after: bool,
    },
    /// No HTTP answer: connection refused or reset, or no answer in time.
    Lost(String),
}

#[derive(Clone, Debug)]
pub struct Call {
    pub kind: Kind,
    /// Which replica slot, and which process in it (1 after a restart).
    pub replica: usize,
    pub generation: u32,
    pub sent: Instant,
    pub answered: Instant,
    pub answer: Answer,
}

impl Call {
    fn decided(&self) -> Option<(Outcome, Option<DateTime<Utc>>)> {
        match self.answer {
            Answer::Decided {
                outcome,
                window_start,
            } => Some((outcome, window_start)),
            _ => None,
        }
    }
}

/// Reads an HTTP answer into the record.
pub async fn answer_of(response: reqwest::Result<reqwest::Response>) -> Answer {
    let response = match response {
        Ok(response) => response,
        Err(error) => return Answer::Lost(error.to_string()),
    };
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let content_type = header("content-type").unwrap_or_default();
    let retry_after = header("retry-after").is_some();
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(error) => return Answer::Lost(error.to_string()),
    };
    if status == 200 {
        return match serde_json::from_slice::<Decision>(&body) {
            Ok(decision) => Answer::Decided {
                outcome: decision.outcome,
                window_start: decision.window_start,
            },
            Err(error) => Answer::Failed {
                status,
                content_type: format!("{content_type} (not a decision: {error})"),
                problem_type: String::new(),
                retry_after,
            },
        };
    }
    let problem_type = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .unwrap_or_default();
    Answer::Failed {
        status,
        content_type,
        problem_type,
        retry_after,
    }
}

/// Shared by every caller.
pub type Recorder = Arc<Mutex<Vec<Call>>>;

/// A fault the suite injected, and when the store was back.
#[derive(Clone, Debug)]
pub struct Fault {
    pub name: &'static str,
    pub store_back: Instant,
}

/// The replica SIGKILLed, and when.
#[derive(Clone, Copy, Debug)]
pub struct Killed {
    pub replica: usize,
    pub at: Instant,
    pub restarted: Instant,
}

/// Slots in the store per quota, summed over windows, once every replica
/// has stopped.
pub type Counted = std::collections::BTreeMap<&'static str, i64>;

pub struct Verdict {
    pub violations: Vec<String>,
    pub worst_recovery: Duration,
}

/// How long a replica may take to decide again once the store is back.
const RECOVERY: Duration = Duration::from_secs(15);
/// What a SIGKILL may lose: the counts of the last flush interval (250 ms),
/// with room for the flush's own transaction.
const KILL_LOSS: Duration = Duration::from_secs(1);

/// Every guarantee the history must show.
pub fn check(
    calls: &[Call],
    ceiling: i64,
    faults: &[Fault],
    killed: Option<Killed>,
    counted: &Counted,
    replicas: usize,
) -> Verdict {
    let mut violations = Vec::new();
    for call in calls {
        if let Some(why) = wrong_answer(call, killed) {
            violations.push(format!("{why}: {call:?}"));
        }
    }
    violations.extend(over_granted_windows(calls, ceiling));
    violations.extend(under_counted(calls, killed, counted));
    let mut worst_recovery = Duration::ZERO;
    for fault in faults {
        for replica in 0..replicas {
            match recovery(calls, replica, fault.store_back) {
                Some(took) if took <= RECOVERY => worst_recovery = worst_recovery.max(took),
                Some(took) => violations.push(format!(
                    "replica {replica} decided again {took:?} after the store's return from {}",
                    fault.name
                )),
                None => violations.push(format!(
                    "replica {replica} never decided again after {}",
                    fault.name
                )),
            }
        }
    }
    if let Some(killed) = killed {
        match recovery(calls, killed.replica, killed.restarted) {
            Some(took) if took <= RECOVERY => worst_recovery = worst_recovery.max(took),
            other => violations.push(format!("the restarted replica decided after {other:?}")),
        }
    }
    Verdict {
        violations,
        worst_recovery,
    }
}

/// Why one answer breaks a guarantee, if it does.
fn wrong_answer(call: &Call, killed: Option<Killed>) -> Option<String> {
    match (&call.answer, call.kind) {
        (Answer::Lost(why), _) => {
            let victim = killed.is_some_and(|k| {
                k.replica == call.replica && call.generation == 0 && call.answered >= k.at
            });
            (!victim).then(|| format!("no answer ({why}) from a replica nobody killed"))
        }
        (Answer::Failed { .. }, Kind::Due) => Some("a deadline call was refused".into()),
        (Answer::Failed { .. }, Kind::Observed | Kind::Counted) => {
            Some("an observed or counted call failed".into())
        }
        (
            Answer::Failed {
                status,
                content_type,
                problem_type,
                retry_after,
            },
            Kind::Enforced,
        ) => (*status != 503
            || content_type != "application/problem+json"
            || !problem_type.ends_with("/store-unavailable")
            || !retry_after)
            .then(|| {
                "a failure other than a 503 store-unavailable problem with Retry-After".into()
            }),
        (
            Answer::Decided {
                outcome,
                window_start,
            },
            kind,
        ) => {
            let expected: &[Outcome] = match kind {
                Kind::Enforced => &[Outcome::Granted, Outcome::Deferred],
                Kind::Due => &[Outcome::Bypassed],
                Kind::Observed => &[Outcome::Granted],
                Kind::Counted => &[Outcome::Unthrottled],
            };
            if !expected.contains(outcome) {
                Some("an outcome this flow cannot have".into())
            } else if kind == Kind::Enforced && window_start.is_none() {
                Some("an enforced decision without its window".into())
            } else {
                None
            }
        }
    }
}

fn over_granted_windows(calls: &[Call], ceiling: i64) -> Vec<String> {
    granted_by_window(calls)
        .into_iter()
        .filter(|(_, n)| *n > ceiling)
        .map(|(window, n)| format!("window {window:?}: {n} granted, ceiling {ceiling}"))
        .collect()
}

/// The store may count more than was answered, never less, save what a
/// SIGKILL can lose: the after-the-fact counts of the killed process's last
/// flush interval.
fn under_counted(calls: &[Call], killed: Option<Killed>, counted: &Counted) -> Vec<String> {
    let at_risk = |call: &Call| {
        killed.is_some_and(|k| {
            call.kind.after_the_fact()
                && call.replica == k.replica
                && call.generation == 0
                && call.answered <= k.at
                && k.at.duration_since(call.answered) <= KILL_LOSS
        })
    };
    // Per quota: slots answered as spent, and how many of them were at risk.
    let mut spent: HashMap<&str, (i64, i64)> = HashMap::new();
    for call in calls {
        let Some((outcome, _)) = call.decided() else {
            continue;
        };
        if matches!(
            outcome,
            Outcome::Granted | Outcome::Bypassed | Outcome::Unthrottled
        ) {
            let entry = spent.entry(call.kind.quota()).or_default();
            entry.0 += 1;
            entry.1 += i64::from(at_risk(call));
        }
    }
    spent
        .into_iter()
        .filter_map(|(quota, (answered, risk))| {
            let in_store = counted.get(quota).copied().unwrap_or(0);
            (in_store < answered - risk).then(|| {
                format!("quota {quota} under-counted: {in_store} in the store, {answered} answered as spent ({risk} at risk from the SIGKILL)")
            })
        })
        .collect()
}

/// How long after `since` replica `replica` answered an enforced decision.
fn recovery(calls: &[Call], replica: usize, since: Instant) -> Option<Duration> {
    calls
        .iter()
        .filter(|c| c.replica == replica && c.kind == Kind::Enforced && c.sent >= since)
        .filter(|c| c.decided().is_some())
        .map(|c| c.answered.duration_since(since))
        .min()
}

/// Enforced grants, for the figures: most in one window.
pub fn most_granted(calls: &[Call]) -> i64 {
    granted_by_window(calls).into_values().max().unwrap_or(0)
}

fn granted_by_window(calls: &[Call]) -> HashMap<Option<DateTime<Utc>>, i64> {
    let mut granted = HashMap::new();
    for call in calls.iter().filter(|c| c.kind == Kind::Enforced) {
        if let Some((Outcome::Granted, window)) = call.decided() {
            *granted.entry(window).or_default() += 1;
        }
    }
    granted
}

/// Answers by kind and by result, for the figures.
pub fn summary(calls: &[Call]) -> String {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for call in calls {
        let result = match &call.answer {
            Answer::Decided { outcome, .. } => format!("{outcome:?}"),
            Answer::Failed { status, .. } => status.to_string(),
            Answer::Lost(_) => "lost".into(),
        };
        *counts
            .entry(format!("{:?} {result}", call.kind))
            .or_default() += 1;
    }
    let mut lines: Vec<_> = counts
        .into_iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect();
    lines.sort();
    lines.join(", ")
}
