//! The observe-mode report: per flow still observing, what enforcement would
//! have done over a period, from the decision tallies. With a what-if ceiling
//! the same report is estimated from the tallies and the window counts.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::catalog::Mode;
use crate::store::{ObserveTally, Store};

/// Hours shown as the worst of a flow.
const WORST_HOURS: usize = 3;

#[derive(Debug, Serialize, ToSchema)]
pub struct Report {
    /// Hours covered, the current one included.
    pub since_hours: i32,
    /// The what-if ceiling, when one was asked for.
    pub ceiling: Option<i64>,
    pub flows: Vec<FlowReport>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FlowReport {
    pub flow: String,
    pub quota: String,
    pub hourly_ceiling: i64,
    /// Decisions enforcement would have deferred.
    pub would_defer: i64,
    /// Of those, decisions that carried a deadline (exact tallies only).
    pub would_defer_with_deadline: Option<i64>,
    pub hours_with_deferrals: usize,
    /// Hours with deferrals, the worst first.
    pub worst_hours: Vec<HourReport>,
    /// Every hour that had a decision, oldest first.
    pub hours: Vec<HourReport>,
    pub verdict: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct HourReport {
    pub window_start: DateTime<Utc>,
    pub decisions: i64,
    pub would_defer: i64,
}

/// Builds the report for the last `since_hours` hours. `what_if_ceiling`
/// recomputes it as if every quota's ceiling were that value, touching nothing.
pub async fn observe_report(
    store: &Store,
    quota: Option<&str>,
    since_hours: i32,
    what_if_ceiling: Option<i64>,
) -> Result<Report, sqlx::Error> {
    let flows = store.list_flows().await?;
    let ceilings: BTreeMap<String, i64> = store
        .list_quotas()
        .await?
        .into_iter()
        .map(|q| (q.name, q.hourly_ceiling))
        .collect();
    let rows = store.observe_tallies(quota, since_hours).await?;
    let mut report = Report {
        since_hours,
        ceiling: what_if_ceiling,
        flows: Vec::new(),
    };
    let observing = flows
        .iter()
        .filter(|f| f.mode == Mode::Observe.as_str() && quota.is_none_or(|q| q == f.quota));
    for flow in observing {
        let quota_ceiling = ceilings.get(&flow.quota).copied().unwrap_or(0);
        let ceiling = what_if_ceiling.unwrap_or(quota_ceiling);
        let mut hours = Vec::new();
        let mut with_deadline = 0;
        for row in rows.iter().filter(|r| r.flow == flow.name) {
            let would_defer = match what_if_ceiling {
                None => row.would_defer,
                Some(n) => would_defer_at(row, quota_ceiling, n),
            };
            with_deadline += row.would_defer_with_deadline;
            hours.push(HourReport {
                window_start: row.window_start,
                decisions: row.decisions,
                would_defer,
            });
        }
        report.flows.push(flow_report(
            &flow.name,
            &flow.quota,
            ceiling,
            hours,
            what_if_ceiling.is_none().then_some(with_deadline),
            since_hours,
            what_if_ceiling,
        ));
    }
    Ok(report)
}

/// Estimates how many of a flow's decisions in one hour a ceiling of `n`
/// would have deferred, from what the quota's own `ceiling` would have (the
/// tally, exact) and the window's count. Observed slots are spent whatever the
/// ceiling, so the hour's running count is the same for every ceiling, and a
/// decision over one ceiling is over every lower one. Below `ceiling`, the
/// decisions that fitted join in the proportion of the fitted slots that lie
/// above `n`; above it, the would-defers stay in the proportion of the slots
/// over `ceiling` that are still over `n`. Slots and decisions are never
/// equated: a decision may take several slots.
fn would_defer_at(row: &ObserveTally, ceiling: i64, n: i64) -> i64 {
    let count = row.window_count as f64;
    let (decisions, would_defer) = (row.decisions as f64, row.would_defer as f64);
    let estimate = if n <= ceiling {
        let fitted = count.min(ceiling as f64);
        let newly_over = (fitted - n as f64).max(0.0) / fitted.max(1.0);
        would_defer + (decisions - would_defer) * newly_over
    } else {
        let over = count - ceiling as f64;
        let still_over = if over > 0.0 {
            (count - n as f64).max(0.0) / over
        } else {
            0.0
        };
        would_defer * still_over
    };
    (estimate.round() as i64).clamp(0, row.decisions)
}

fn flow_report(
    flow: &str,
    quota: &str,
    hourly_ceiling: i64,
    hours: Vec<HourReport>,
    would_defer_with_deadline: Option<i64>,
    since_hours: i32,
    what_if_ceiling: Option<i64>,
) -> FlowReport {
    let would_defer: i64 = hours.iter().map(|h| h.would_defer).sum();
    let mut worst_hours: Vec<HourReport> = hours
        .iter()
        .filter(|h| h.would_defer > 0)
        .cloned()
        .collect();
    let hours_with_deferrals = worst_hours.len();
    worst_hours.sort_by(|a, b| {
        b.would_defer
            .cmp(&a.would_defer)
            .then(a.window_start.cmp(&b.window_start))
    });
    worst_hours.truncate(WORST_HOURS);
    let condition = match what_if_ceiling {
        Some(n) => format!("with a ceiling of {n}, enforcing {flow} would have deferred about"),
        None => format!("enforcing {flow} now would have deferred"),
    };
    let verdict = match worst_hours.first() {
        None => format!("{condition} nothing in the last {since_hours} hours"),
        Some(worst) => format!(
            "{condition} {would_defer} decisions in {hours_with_deferrals} of the last {since_hours} hours (worst: {}, {})",
            worst.window_start.format("%Y-%m-%d %H:%MZ"),
            worst.would_defer
        ),
    };
    FlowReport {
        flow: flow.to_string(),
        quota: quota.to_string(),
        hourly_ceiling,
        would_defer,
        would_defer_with_deadline,
        hours_with_deferrals,
        worst_hours,
        hours,
        verdict,
    }
}

/// `7d`, `36h`, `90m` as whole hours (rounded up), 1 hour to a year.
pub fn parse_since(text: &str) -> Result<i32, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 7d or 36h: {e}"))?;
    let hours = duration.as_secs().div_ceil(3600);
    i32::try_from(hours)
        .ok()
        .filter(|h| (1..=8784).contains(h))
        .ok_or_else(|| format!("`{text}` must be between 1 hour and 366 days"))
}
