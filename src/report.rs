//! The observe-mode report: per flow still observing, what enforcement would
//! have done over a period, from the decision tallies, and per window of its
//! quotas how often and by how much the window went over its ceiling. With
//! what-if ceilings (per period) the same report is estimated from the
//! tallies and every window's count (docs/design.md §6, §12).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::catalog::validate_ceiling;
use crate::domain::catalog::Mode;
use crate::domain::window::{parse_cli_window, Period};
use crate::store::{CountedWindow, QuotaRow, SpentHour, Store};

/// Hours shown as the worst of a flow.
const WORST_HOURS: usize = 3;

/// What-if ceilings by period (`1h=800,1d=8000`): as if every reported quota
/// that has a window of that period had that ceiling. Periods not named keep
/// their quotas' own ceilings; none at all is the plain report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WhatIf(BTreeMap<Period, i64>);

impl WhatIf {
    /// `1m=400,1d=8000` (the CLI repeats `--what-if` instead); `hour`, the
    /// older `ceiling`, is the `1h` one.
    pub fn parse(list: Option<&str>, hour: Option<i64>) -> Result<Self, String> {
        let mut what_if = BTreeMap::new();
        for item in list.into_iter().flat_map(|l| l.split(',')) {
            // A window as the CLI's `--window` spells it, less the zone: a
            // what-if changes a window's ceiling, not where it starts.
            let spec = parse_cli_window(item.trim())?;
            if spec.zone.is_some() {
                return Err(format!(
                    "`{item}`: a what-if is PERIOD=CEILING, without a zone"
                ));
            }
            let window = spec.rule()?;
            if what_if.insert(window.period, window.ceiling).is_some() {
                return Err(format!("the `{}` window is given twice", window.period));
            }
        }
        if let Some(ceiling) = hour {
            validate_ceiling("ceiling", ceiling)?;
            if what_if.insert(Period::HOUR, ceiling).is_some() {
                return Err("`ceiling` is the `1h` what-if: give it once".to_string());
            }
        }
        Ok(WhatIf(what_if))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn ceiling(&self, period: Period) -> Option<i64> {
        self.0.get(&period).copied()
    }

    /// `1h=800, 1d=8000`.
    fn spelled(&self) -> String {
        let items: Vec<String> = self.0.iter().map(|(p, c)| format!("{p}={c}")).collect();
        items.join(", ")
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Report {
    /// Hours covered, the current one included.
    pub since_hours: i32,
    /// The what-if `1h` ceiling, when one was asked for.
    pub ceiling: Option<i64>,
    /// Every what-if ceiling asked for, by period (`{"1d": 8000}`); empty:
    /// the report at the quotas' own ceilings, from exact tallies.
    pub what_if: BTreeMap<String, i64>,
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
    /// The quota its answers name (the first of `quotas`).
    pub quota: String,
    /// Every quota it spends.
    pub quotas: Vec<String>,
    /// The `quota`'s `1h` ceiling (the what-if one when asked; 0 without an hour).
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
    /// Every window of its quotas over the period (every flow that spends
    /// them spent into them): how many went over the ceiling, by how much.
    pub windows: Vec<WindowReport>,
    pub verdict: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct HourReport {
    pub window_start: DateTime<Utc>,
    pub decisions: i64,
    pub would_defer: i64,
}

/// One window of a quota over the report's period, from the windows'
/// counts: exact, since observed slots are spent whatever the ceiling.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct WindowReport {
    pub quota: String,
    pub period: String,
    /// The quota's own ceiling for the period.
    pub ceiling: i64,
    /// The what-if ceiling for the period, when one was asked for: what
    /// `windows_over` and `slots_over` are measured against.
    pub what_if_ceiling: Option<i64>,
    /// Windows of the period that counted anything.
    pub windows: usize,
    /// Of those, the windows that counted more than the ceiling.
    pub windows_over: usize,
    /// Slots counted past the ceiling, summed over those windows.
    pub slots_over: i64,
    /// The window that counted most.
    pub fullest: Option<FullestWindow>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FullestWindow {
    pub window_start: DateTime<Utc>,
    pub count: i64,
}

/// Builds the report for the last `since_hours` hours. `what_if` recomputes
/// it as if the quotas' windows of its periods had its ceilings, touching
/// nothing; a what-if for a period none of the reported quotas has is the
/// caller's mistake (the inner `Err`). `history_retention` is how long
/// tallies are kept (0: forever).
pub(crate) async fn observe_report(
    store: &Store,
    quota: Option<&str>,
    since_hours: i32,
    what_if: &WhatIf,
    history_retention: Duration,
) -> Result<Result<Report, String>, sqlx::Error> {
    let flows = store.list_flows().await?;
    let quotas: BTreeMap<String, QuotaRow> = store
        .list_quotas()
        .await?
        .into_iter()
        .map(|q| (q.name.clone(), q))
        .collect();
    let observing: Vec<_> = flows
        .iter()
        .filter(|f| f.mode == Mode::Observe.as_str() && quota.is_none_or(|q| q == f.quota))
        .collect();
    if let Some(missing) = missing_period(what_if, quota, &quotas, &observing) {
        return Ok(Err(missing));
    }
    let rows = store.observe_tallies(quota, since_hours).await?;
    let windows = store.report_windows(quota, since_hours).await?;
    let over = if what_if.is_empty() {
        None
    } else {
        let names: Vec<String> = windows.iter().map(|w| w.quota.clone()).collect();
        let from = windows.iter().map(|w| w.window_start).min();
        let spent = match from {
            Some(from) => store.report_spent_hours(&names, from).await?,
            None => Vec::new(),
        };
        let own = |quota: &str, period: Period| own_ceiling(&quotas, quota, period);
        let asked = |quota: &str, period: Period| what_if.ceiling(period).or(own(quota, period));
        Some((
            over_by_hour(&windows, &spent, own),
            over_by_hour(&windows, &spent, asked),
        ))
    };
    let oldest_tally = store.oldest_tally(quota).await?;
    let kept_for = (!history_retention.is_zero()).then_some(history_retention);
    let mut report = Report {
        since_hours,
        ceiling: what_if.ceiling(Period::HOUR),
        what_if: what_if.0.iter().map(|(p, c)| (p.to_string(), *c)).collect(),
        history_retention: kept_for.map(whole_units),
        oldest_tally,
        reach: reach(since_hours, kept_for, oldest_tally),
        flows: Vec::new(),
    };
    for flow in observing {
        let hour = |q: &str| {
            what_if
                .ceiling(Period::HOUR)
                .or(own_ceiling(&quotas, q, Period::HOUR))
        };
        let mut hours = Vec::new();
        let mut with_deadline = 0;
        for row in rows.iter().filter(|r| r.flow == flow.name) {
            let would_defer = match &over {
                None => row.would_defer,
                Some((own, asked)) => {
                    let share = |by: &HashMap<_, f64>| {
                        let over = flow
                            .quotas
                            .iter()
                            .filter_map(|q| by.get(&(q.clone(), row.window_start)).copied());
                        over.fold(0.0, f64::max)
                    };
                    would_defer_at(row.decisions, row.would_defer, share(own), share(asked))
                }
            };
            with_deadline += row.would_defer_with_deadline;
            hours.push(HourReport {
                window_start: row.window_start,
                decisions: row.decisions,
                would_defer,
            });
        }
        let windows = window_reports(&flow.quotas, &quotas, &windows, what_if);
        report.flows.push(flow_report(
            &flow.name,
            (&flow.quota, &flow.quotas),
            hour(&flow.quota).unwrap_or(0),
            hours,
            windows,
            over.is_none().then_some(with_deadline),
            since_hours,
            what_if,
        ));
    }
    Ok(Ok(report))
}

/// The quota's own ceiling for `period`; `None` when it has no such window.
fn own_ceiling(quotas: &BTreeMap<String, QuotaRow>, quota: &str, period: Period) -> Option<i64> {
    let quota = quotas.get(quota)?;
    let window = quota
        .windows
        .iter()
        .find(|w| Period::parse(&w.period) == Ok(period))?;
    Some(window.ceiling)
}

/// A what-if period that no quota of the report has: a what-if changes a
/// window's ceiling, it adds no window (there would be no count to read).
fn missing_period(
    what_if: &WhatIf,
    quota: Option<&str>,
    quotas: &BTreeMap<String, QuotaRow>,
    observing: &[&crate::store::FlowRow],
) -> Option<String> {
    let mut reported: BTreeSet<&str> = observing
        .iter()
        .flat_map(|f| f.quotas.iter().map(String::as_str))
        .collect();
    reported.extend(quota);
    if reported.is_empty() {
        reported = quotas.keys().map(String::as_str).collect();
    }
    let period = what_if.0.keys().find(|&&period| {
        !reported
            .iter()
            .any(|q| own_ceiling(quotas, q, period).is_some())
    })?;
    let whose = match quota {
        Some(quota) => format!("quota `{quota}`"),
        None => "no quota of the report".to_string(),
    };
    Some(format!(
        "{whose} has a `{period}` window: a what-if changes a window's ceiling, it adds none"
    ))
}

/// Per quota and hour, the share of the slots spent in that hour that lay
/// over the ceiling of their window (`ceiling_of`; a period the quota no
/// longer has is left out), the largest of the quota's windows. Observed
/// slots are spent whatever the ceiling, so a window's count is its demand,
/// and the slots over a ceiling are its last ones. A window is spread over
/// the hours it spans by the decisions tallied in each (`spent`, every flow
/// of the quota; evenly where none were), then walked in order: the hour in
/// which its running count passes the ceiling and those after hold what is
/// over. Within an hour nothing says who came first: an estimate.
fn over_by_hour(
    windows: &[CountedWindow],
    spent: &[SpentHour],
    ceiling_of: impl Fn(&str, Period) -> Option<i64>,
) -> HashMap<(String, DateTime<Utc>), f64> {
    let spent: HashMap<(&str, DateTime<Utc>), f64> = spent
        .iter()
        .map(|s| ((s.quota.as_str(), s.window_start), s.spent as f64))
        .collect();
    // (quota, period, hour) → (slots spent in it, of which over)
    let mut per_hour: HashMap<(&str, Period, DateTime<Utc>), (f64, f64)> = HashMap::new();
    for window in windows {
        let Ok(period) = Period::parse(&window.period) else {
            continue;
        };
        let Some(ceiling) = ceiling_of(&window.quota, period) else {
            continue;
        };
        let hours = hours_of(window.window_start, window.ends_at);
        let weights: Vec<f64> = hours
            .iter()
            .map(|(hour, overlap)| {
                overlap
                    * spent
                        .get(&(window.quota.as_str(), *hour))
                        .copied()
                        .unwrap_or(0.0)
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let overlap_total: f64 = hours.iter().map(|(_, overlap)| overlap).sum();
        let mut running = 0.0;
        for ((hour, overlap), weight) in hours.iter().zip(&weights) {
            let part = if total > 0.0 {
                weight / total
            } else {
                overlap / overlap_total
            };
            let slots = window.count as f64 * part;
            let limit = ceiling as f64;
            let over = (running + slots - limit).max(0.0) - (running - limit).max(0.0);
            running += slots;
            let entry = per_hour
                .entry((window.quota.as_str(), period, *hour))
                .or_default();
            entry.0 += slots;
            entry.1 += over;
        }
    }
    let mut share: HashMap<(String, DateTime<Utc>), f64> = HashMap::new();
    for ((quota, _, hour), (slots, over)) in per_hour {
        if slots > 0.0 {
            let entry = share.entry((quota.to_string(), hour)).or_default();
            *entry = entry.max(over / slots);
        }
    }
    share
}

/// The UTC hours a window spans, each with the part of the hour it covers.
fn hours_of(start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<(DateTime<Utc>, f64)> {
    let hour = TimeDelta::hours(1);
    let Ok(mut at) = start.duration_trunc(hour) else {
        return Vec::new();
    };
    let mut hours = Vec::new();
    while at < end {
        let covered = (end.min(at + hour) - start.max(at)).num_milliseconds() as f64;
        hours.push((at, covered / 3_600_000.0));
        at += hour;
    }
    hours
}

/// Estimates how many of an hour's `decisions` a what-if would have deferred,
/// from the would-defers the tally counted at the quotas' own ceilings (exact)
/// and the share of the hour's slots over them (`own`) and over the what-if
/// ceilings (`asked`). A decision over one ceiling is over every lower one.
/// Past the own share, the decisions that fitted join in the proportion of
/// the fitted slots that lie over the what-if; short of it, the would-defers
/// stay in the proportion of the slots over that are still over. Slots and
/// decisions are never equated: a decision may take several slots.
fn would_defer_at(decisions: i64, would_defer: i64, own: f64, asked: f64) -> i64 {
    let (decisions_f, would_defer_f) = (decisions as f64, would_defer as f64);
    let estimate = if asked >= own {
        let fitted = 1.0 - own;
        if fitted <= 0.0 {
            would_defer_f
        } else {
            would_defer_f + (decisions_f - would_defer_f) * (asked - own) / fitted
        }
    } else {
        would_defer_f * asked / own
    };
    (estimate.round() as i64).clamp(0, decisions)
}

/// Per window of `flow_quotas` (as configured), what the report's windows
/// counted, against the what-if ceiling where one was asked.
fn window_reports(
    flow_quotas: &[String],
    quotas: &BTreeMap<String, QuotaRow>,
    counted: &[CountedWindow],
    what_if: &WhatIf,
) -> Vec<WindowReport> {
    let mut reports = Vec::new();
    for name in flow_quotas {
        let Some(quota) = quotas.get(name) else {
            continue;
        };
        for spec in &quota.windows {
            let Ok(period) = Period::parse(&spec.period) else {
                continue;
            };
            let what_if_ceiling = what_if.ceiling(period);
            let ceiling = what_if_ceiling.unwrap_or(spec.ceiling);
            let mut report = WindowReport {
                quota: name.clone(),
                period: spec.period.clone(),
                ceiling: spec.ceiling,
                what_if_ceiling,
                windows: 0,
                windows_over: 0,
                slots_over: 0,
                fullest: None,
            };
            let windows = counted
                .iter()
                .filter(|w| &w.quota == name && w.period == spec.period && w.count > 0);
            for window in windows {
                report.windows += 1;
                if window.count > ceiling {
                    report.windows_over += 1;
                    report.slots_over += window.count - ceiling;
                }
                if report
                    .fullest
                    .as_ref()
                    .is_none_or(|f| window.count > f.count)
                {
                    report.fullest = Some(FullestWindow {
                        window_start: window.window_start,
                        count: window.count,
                    });
                }
            }
            reports.push(report);
        }
    }
    reports
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

#[allow(clippy::too_many_arguments)]
fn flow_report(
    flow: &str,
    (quota, quotas): (&str, &[String]),
    hourly_ceiling: i64,
    hours: Vec<HourReport>,
    windows: Vec<WindowReport>,
    would_defer_with_deadline: Option<i64>,
    since_hours: i32,
    what_if: &WhatIf,
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
    let condition = if what_if.is_empty() {
        format!("enforcing {flow} now would have deferred")
    } else {
        let ceilings = what_if.spelled();
        format!("with ceilings {ceilings}, enforcing {flow} would have deferred about")
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
        quotas: quotas.to_vec(),
        hourly_ceiling,
        would_defer,
        would_defer_with_deadline,
        hours_with_deferrals,
        worst_hours,
        hours,
        windows,
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

    fn at(hour: i64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + TimeDelta::hours(hour)
    }

    fn window(period: &str, start: DateTime<Utc>, end: DateTime<Utc>, count: i64) -> CountedWindow {
        CountedWindow {
            quota: "ppf".into(),
            period: period.into(),
            window_start: start,
            ends_at: end,
            count,
        }
    }

    fn spent(hour: i64, spent: i64) -> SpentHour {
        SpentHour {
            quota: "ppf".into(),
            window_start: at(hour),
            spent,
        }
    }

    /// The over-share of an hour, from a single window rule of `ceiling`.
    fn shares(windows: &[CountedWindow], spent: &[SpentHour], ceiling: i64) -> Vec<f64> {
        let over = over_by_hour(windows, spent, |_, _| Some(ceiling));
        (0..4)
            .map(|h| {
                over.get(&("ppf".to_string(), at(h)))
                    .copied()
                    .unwrap_or(0.0)
            })
            .collect()
    }

    #[test]
    fn a_lower_ceiling_defers_the_share_of_fitted_slots_above_it() {
        // 1000 slots fitted under a ceiling of 1000: half of them lie above 500.
        assert_eq!(would_defer_at(1000, 0, 0.0, 0.5), 500);
        // 200 of 1200 were over already; half of the 1000 that fitted join them.
        assert_eq!(
            would_defer_at(1200, 200, 200.0 / 1200.0, 700.0 / 1200.0),
            700
        );
        // Every slot over the own ceiling: nothing fitted to join.
        assert_eq!(would_defer_at(10, 10, 1.0, 1.0), 10);
    }

    #[test]
    fn a_higher_ceiling_keeps_the_share_of_would_defers_still_over_it() {
        // 500 slots of 1500 over 1000; at 1200, 300 of them are still over.
        assert_eq!(
            would_defer_at(1500, 500, 500.0 / 1500.0, 300.0 / 1500.0),
            300
        );
        assert_eq!(would_defer_at(1500, 500, 500.0 / 1500.0, 0.0), 0);
        // The own ceilings asked again: the tally, exactly.
        assert_eq!(would_defer_at(7, 3, 0.25, 0.25), 3);
    }

    #[test]
    fn a_day_puts_its_slots_over_the_ceiling_in_the_hours_after_it_filled() {
        // 1000 slots in a day, spent 400, 400, 200 in its first three hours:
        // at 800 the day fills during the second hour, and the third is all over.
        let day = [window("1d", at(0), at(24), 1000)];
        let hours = [spent(0, 40), spent(1, 40), spent(2, 20)];
        assert_eq!(shares(&day, &hours, 800), [0.0, 0.0, 1.0, 0.0]);
        let half_of_second = shares(&day, &hours, 600);
        assert_eq!(half_of_second[..3], [0.0, 0.5, 1.0]);
        // Without tallies the count is spread evenly over the 24 hours: at
        // 100, the third hour's 41.7 slots pass it by 25.
        let even = shares(&day, &[], 100);
        let expected = [0.0, 0.0, 0.6, 1.0];
        assert!(
            even.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-9),
            "{even:?}"
        );
    }

    #[test]
    fn minutes_of_one_hour_add_up_to_its_share() {
        // Two minutes of one hour, 10 and 4 slots at a ceiling of 5: 5 of 14 over.
        let minute = |m: i64, count| {
            let start = at(1) + TimeDelta::minutes(m);
            window("1m", start, start + TimeDelta::minutes(1), count)
        };
        let over = shares(&[minute(0, 10), minute(1, 4)], &[], 5);
        assert!((over[1] - 5.0 / 14.0).abs() < 1e-9, "{over:?}");
        assert_eq!(over[0], 0.0);
    }

    #[test]
    fn of_several_windows_the_fullest_decides_an_hour() {
        let day = window("1d", at(0), at(24), 100);
        let hour = window("1h", at(0), at(1), 100);
        let ceilings = |_: &str, period: Period| Some(if period == Period::HOUR { 50 } else { 90 });
        let over = over_by_hour(&[day, hour], &[spent(0, 1)], ceilings);
        assert_eq!(over[&("ppf".to_string(), at(0))], 0.5);
    }

    #[test]
    fn a_window_covers_the_parts_of_the_hours_it_spans() {
        let start = at(2) + TimeDelta::minutes(30);
        let hours = hours_of(start, start + TimeDelta::minutes(90));
        assert_eq!(hours, [(at(2), 0.5), (at(3), 1.0)]);
    }

    #[test]
    fn a_what_if_names_each_period_once() {
        let what_if = WhatIf::parse(Some("1m=400, 1d=8000"), None).unwrap();
        assert_eq!(what_if.spelled(), "1m=400, 1d=8000");
        assert_eq!(
            WhatIf::parse(None, Some(800)).unwrap(),
            WhatIf::parse(Some("60m=800"), None).unwrap()
        );
        for (list, hour) in [
            (Some("1d=1,1d=2"), None),
            (Some("1h=1"), Some(2)),
            (Some("7m=1"), None),
            (Some("1d"), None),
            (Some("1d=-1"), None),
            (Some("1d=5@UTC"), None),
            (None, Some(-1)),
        ] {
            assert!(WhatIf::parse(list, hour).is_err(), "{list:?} {hour:?}");
        }
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
        let hours = [(0, 0), (1, 5), (2, 3)]
            .map(|(h, would_defer)| HourReport {
                window_start: at(h),
                decisions: 10,
                would_defer,
            })
            .to_vec();
        let quotas = ["ppf".to_string()];
        let report = flow_report(
            "sync",
            ("ppf", &quotas),
            100,
            hours,
            Vec::new(),
            Some(0),
            24,
            &WhatIf::default(),
        );
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
