//! The observe-mode report: per flow still observing, what enforcement would
//! have done over a period, from the decision tallies. With a what-if ceiling
//! the same report is estimated from the tallies and the window counts.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::catalog::Mode;
use crate::store::{ObserveTally, Store};

/// Hours shown as the worst of a flow.
const WORST_HOURS: usize = 3;

#[derive(Debug, Serialize, ToSchema)]
pub struct Report {
    /// Hours covered, the current one included.
    pub since_hours: i32,
    /// The what-if ceiling, when one was asked for.
    pub ceiling: Option<i64>,
    /// How long windows and tallies are kept (`7d`, `36h`), as the process
    /// answering is configured; `null`: forever.
    pub history_retention: Option<String>,
    /// The oldest hour whose tallies are still kept; `null`: none yet.
    pub oldest_tally: Option<DateTime<Utc>>,
    /// How far back the report can look, in words; it says so when `since`
    /// asks for more than the retention keeps.
    pub reach: String,
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
/// `history_retention` is how long tallies are kept (0: forever).
pub(crate) async fn observe_report(
    store: &Store,
    quota: Option<&str>,
    since_hours: i32,
    what_if_ceiling: Option<i64>,
    history_retention: Duration,
) -> Result<Report, sqlx::Error> {
    let flows = store.list_flows().await?;
    let ceilings: BTreeMap<String, i64> = store
        .list_quotas()
        .await?
        .into_iter()
        .map(|q| (q.name, q.hourly_ceiling.unwrap_or(0)))
        .collect();
    let rows = store.observe_tallies(quota, since_hours).await?;
    let oldest_tally = store.oldest_tally(quota).await?;
    let kept_for = (!history_retention.is_zero()).then_some(history_retention);
    let mut report = Report {
        since_hours,
        ceiling: what_if_ceiling,
        history_retention: kept_for.map(whole_units),
        oldest_tally,
        reach: reach(since_hours, kept_for, oldest_tally),
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

/// How far back tallies go, and whether `since_hours` asks for more than is kept.
fn reach(since_hours: i32, kept_for: Option<Duration>, oldest: Option<DateTime<Utc>>) -> String {
    let kept = kept_for.map_or_else(
        || "tallies are kept forever".to_string(),
        |retention| format!("tallies are kept for {}", whole_units(retention)),
    );
    let oldest = oldest.map_or_else(
        || "none is kept yet".to_string(),
        |hour| format!("the oldest kept is from {}", hour.format("%Y-%m-%d %H:%MZ")),
    );
    let asked = u64::try_from(since_hours).unwrap_or(0) * 3600;
    match kept_for {
        Some(retention) if asked > retention.as_secs() => format!(
            "the last {since_hours} hours were asked for, but {kept}: the report cannot look back further ({oldest})"
        ),
        _ => format!("{kept}; {oldest}"),
    }
}

/// `90d`, `36h`: a retention the way it is configured, not in 30.44-day months.
fn whole_units(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match (seconds % 86_400, seconds % 3600, duration.subsec_nanos()) {
        (0, _, 0) => format!("{}d", seconds / 86_400),
        (_, 0, 0) => format!("{}h", seconds / 3600),
        _ => humantime::format_duration(duration).to_string(),
    }
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
pub(crate) fn parse_since(text: &str) -> Result<i32, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 7d or 36h: {e}"))?;
    let hours = duration.as_secs().div_ceil(3600);
    i32::try_from(hours)
        .ok()
        .filter(|h| (1..=8784).contains(h))
        .ok_or_else(|| format!("`{text}` must be between 1 hour and 366 days"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hour(decisions: i64, would_defer: i64, window_count: i64) -> ObserveTally {
        ObserveTally {
            flow: "sync".into(),
            quota: "ppf".into(),
            window_start: DateTime::<Utc>::UNIX_EPOCH,
            decisions,
            would_defer,
            would_defer_with_deadline: 0,
            window_count,
        }
    }

    #[test]
    fn a_lower_ceiling_defers_the_share_of_fitted_slots_above_it() {
        // 1000 slots fitted under a ceiling of 1000: half of them lie above 500.
        assert_eq!(would_defer_at(&hour(1000, 0, 1000), 1000, 500), 500);
        // 200 were over already; half of the 1000 that fitted join them.
        assert_eq!(would_defer_at(&hour(1200, 200, 1200), 1000, 500), 700);
    }

    #[test]
    fn a_higher_ceiling_keeps_the_share_of_would_defers_still_over_it() {
        // 500 slots over 1000; at 1200, 300 of them are still over.
        assert_eq!(would_defer_at(&hour(1500, 500, 1500), 1000, 1200), 300);
        assert_eq!(would_defer_at(&hour(1500, 500, 1500), 1000, 2000), 0);
    }

    #[test]
    fn a_retention_is_shown_in_the_unit_it_was_set_in() {
        let hours = |h: u64| Duration::from_secs(h * 3600);
        assert_eq!(whole_units(hours(90 * 24)), "90d");
        assert_eq!(whole_units(hours(36)), "36h");
        assert_eq!(whole_units(Duration::from_secs(5400)), "1h 30m");
    }

    #[test]
    fn only_hours_with_would_defers_count_among_the_worst() {
        let at = |h: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::hours(h);
        let hours = [(0, 0), (1, 5), (2, 3)]
            .map(|(h, would_defer)| HourReport {
                window_start: at(h),
                decisions: 10,
                would_defer,
            })
            .to_vec();
        let report = flow_report("sync", "ppf", 100, hours, Some(0), 24, None);
        assert_eq!(report.would_defer, 8);
        assert_eq!(report.hours_with_deferrals, 2);
        let worst: Vec<i64> = report.worst_hours.iter().map(|h| h.would_defer).collect();
        assert_eq!(worst, [5, 3]);
        assert!(
            report
                .verdict
                .contains("8 decisions in 2 of the last 24 hours"),
            "{}",
            report.verdict
        );
    }
}
