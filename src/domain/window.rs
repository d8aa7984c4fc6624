//! A quota's stacked windows (docs/design.md §2, §12): each a period that
//! divides a day evenly (`1s` … `1d`) or a calendar month (`1mo`), with its
//! own ceiling, in UTC or, for `1d` and `1mo`, at the local midnight of an
//! IANA zone. Where a window starts and ends is the database's to say
//! (`window_start_of()`); this module only names periods and checks them.

use std::cmp::Ordering;
use std::fmt;

use chrono::{DateTime, Utc};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::MAX_CEILING;

const DAY_SECONDS: u32 = 86_400;

/// The length of a window: a number of seconds that divides a day, or a
/// calendar month. Always in its canonical spelling (`60s` is `1m`, `24h`
/// is `1d`), so that two spellings of one period are one period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    Seconds(u32),
    Month,
}

impl Period {
    pub const HOUR: Period = Period::Seconds(3600);

    /// Parses `1m`, `15m`, `1h`, `1d`, `1mo` …; a period that does not
    /// divide a day evenly is refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "1mo" {
            return Ok(Period::Month);
        }
        let unit = text.chars().last().unwrap_or(' ');
        let digits = &text[..text.len().saturating_sub(1)];
        let scale = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => DAY_SECONDS,
            _ => 0,
        };
        let number = (!digits.is_empty() && digits.len() <= 5 && !digits.starts_with('0'))
            .then(|| digits.parse::<u32>().ok())
            .flatten();
        let Some(seconds) = number.and_then(|n| n.checked_mul(scale)).filter(|&s| s > 0) else {
            return Err(format!(
                "`period` `{text}` is not a period (a number and s, m, h or d, or 1mo)"
            ));
        };
        if !DAY_SECONDS.is_multiple_of(seconds) {
            return Err(format!(
                "`period` `{text}` does not divide a day evenly (1m, 5m, 15m, 1h, 6h, 1d …)"
            ));
        }
        Ok(Period::Seconds(seconds))
    }

    /// Only a day or a month starts at a zone's local midnight.
    pub fn takes_a_zone(self) -> bool {
        matches!(self, Period::Seconds(DAY_SECONDS) | Period::Month)
    }

    /// Seconds in the window (a month's varies: `None`); the `w` of a
    /// RateLimit policy item uses the nominal length.
    pub fn seconds(self) -> Option<u32> {
        match self {
            Period::Seconds(s) => Some(s),
            Period::Month => None,
        }
    }

    /// Seconds for ordering and for a RateLimit policy's `w`: a month as 30 days.
    pub fn nominal_seconds(self) -> u64 {
        match self {
            Period::Seconds(s) => u64::from(s),
            Period::Month => 30 * u64::from(DAY_SECONDS),
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Period::Month => f.write_str("1mo"),
            Period::Seconds(s) if s.is_multiple_of(DAY_SECONDS) => {
                write!(f, "{}d", s / DAY_SECONDS)
            }
            Period::Seconds(s) if s.is_multiple_of(3600) => write!(f, "{}h", s / 3600),
            Period::Seconds(s) if s.is_multiple_of(60) => write!(f, "{}m", s / 60),
            Period::Seconds(s) => write!(f, "{s}s"),
        }
    }
}

impl Ord for Period {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nominal_seconds().cmp(&other.nominal_seconds())
    }
}

impl PartialOrd for Period {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One window of a quota, as the catalog holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowRule {
    pub period: Period,
    /// Slots per window; below 1 refuses everything.
    pub ceiling: i64,
    /// IANA zone of a `1d` or `1mo` window; `None`: UTC.
    pub zone: Option<String>,
}

impl WindowRule {
    pub fn hour(ceiling: i64) -> Self {
        Self {
            period: Period::HOUR,
            ceiling,
            zone: None,
        }
    }

    /// The part of the ceiling open to a flow that may use `share` percent
    /// of it (`None`: all of it).
    pub fn ceiling_for(&self, share: Option<i16>) -> i64 {
        ceiling_at(self.ceiling, share)
    }

    /// The name of the window in a RateLimit policy and in metrics: the
    /// quota's name and the period (`ppf-1d`).
    pub fn policy_name(&self, quota: &str) -> String {
        format!("{quota}-{}", self.period)
    }
}

/// One window of a quota as a take found it, by the database clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowCount {
    pub period: Period,
    pub window_start: DateTime<Utc>,
    pub window_end: DateTime<Utc>,
    /// The window's ceiling (the whole of it, whatever a flow's share).
    pub ceiling: i64,
    /// The count the take started from.
    pub count_before: i64,
}

/// When a window refusing a reservation reopens: its end, and which it is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reopening {
    pub period: Period,
    pub at: DateTime<Utc>,
}

/// What a flow that may use `share` percent of each window can still spend
/// of the quota, every window counted (a grant spends all of them alike):
/// the least any window has left. No window: no bound.
pub fn room(windows: &[WindowCount], share: Option<i16>) -> i64 {
    windows
        .iter()
        .map(|w| ceiling_at(w.ceiling, share) - w.count_before)
        .min()
        .unwrap_or(i64::MAX)
}

/// The window that refuses `slots` once `spent` more were counted in every
/// window (a group's grants): of those without room, the one that reopens
/// last, since every refusing window must roll over before the slots fit
/// (design.md §12). `None` when every window has room.
pub fn refusing(
    windows: &[WindowCount],
    share: Option<i16>,
    spent: i64,
    slots: i64,
) -> Option<Reopening> {
    windows
        .iter()
        .filter(|w| w.count_before + spent + slots > ceiling_at(w.ceiling, share))
        .max_by_key(|w| w.window_end)
        .map(|w| Reopening {
            period: w.period,
            at: w.window_end,
        })
}

/// The part of `ceiling` open to a flow that may use `share` percent of it.
fn ceiling_at(ceiling: i64, share: Option<i16>) -> i64 {
    share.map_or(ceiling, |percent| {
        ceiling * i64::from(percent.clamp(0, 100)) / 100
    })
}

/// A window as the API, the CLI and the config file write it:
/// `{"period": "1m", "ceiling": 500}`, `{"period": "1d", "ceiling": 10000,
/// "zone": "America/Los_Angeles"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    /// A duration that divides a day evenly (`1s` … `1d`: `1m`, `5m`, `1h`, …) or `1mo`.
    #[schema(example = "1m", pattern = "^([1-9][0-9]{0,4}[smhd]|1mo)$")]
    pub period: String,
    /// Slots per window; below 1 refuses everything.
    #[schema(minimum = 0, maximum = 9007199254740992_i64)]
    #[serde(deserialize_with = "crate::domain::input::integer::required")]
    pub ceiling: i64,
    /// `1d` and `1mo` only: the IANA time zone whose local midnight starts
    /// the window (default UTC); one PostgreSQL knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9/_+-]{1,64}$", example = "America/Los_Angeles")]
    pub zone: Option<String>,
}

impl WindowSpec {
    /// The window it declares, checked as far as the service can without
    /// the database (whether PostgreSQL knows the zone is the store's check).
    pub fn rule(&self) -> Result<WindowRule, String> {
        let period = Period::parse(&self.period)?;
        if !(0..=MAX_CEILING).contains(&self.ceiling) {
            return Err(format!(
                "the `{period}` window's `ceiling` must be between 0 and {MAX_CEILING}"
            ));
        }
        if let Some(zone) = &self.zone {
            if !period.takes_a_zone() {
                return Err(format!(
                    "a `{period}` window has no `zone`: only 1d and 1mo start at a local midnight"
                ));
            }
            let plausible = !zone.is_empty()
                && zone.len() <= 64
                && zone
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/_+-".contains(c));
            if !plausible {
                return Err(format!("`zone` `{zone}` is not a time zone name"));
            }
        }
        Ok(WindowRule {
            period,
            ceiling: self.ceiling,
            zone: self.zone.clone().filter(|z| z != "UTC"),
        })
    }
}

/// The CLI's spelling, which [`parse_cli_window`] reads back:
/// `1m=500`, `1d=10000@America/Los_Angeles`.
impl fmt::Display for WindowSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.period, self.ceiling)?;
        match &self.zone {
            Some(zone) => write!(f, "@{zone}"),
            None => Ok(()),
        }
    }
}

/// The `1h` window's ceiling, which answers and views call `hourly_ceiling`.
pub fn hourly_ceiling(windows: &[WindowRule]) -> Option<i64> {
    windows
        .iter()
        .find(|w| w.period == Period::HOUR)
        .map(|w| w.ceiling)
}

/// Which of a quota's windows (by their periods, shortest first) answers
/// name (design.md §12): the hour when there is one, else the shortest;
/// `None` without windows.
pub fn primary(periods: impl IntoIterator<Item = Period>) -> Option<usize> {
    let mut count = 0;
    for (i, period) in periods.into_iter().enumerate() {
        if period == Period::HOUR {
            return Some(i);
        }
        count += 1;
    }
    (count > 0).then_some(0)
}

impl From<&WindowRule> for WindowSpec {
    fn from(rule: &WindowRule) -> Self {
        WindowSpec {
            period: rule.period.to_string(),
            ceiling: rule.ceiling,
            zone: rule.zone.clone(),
        }
    }
}

/// A quota's windows, shortest first, each period once.
pub fn windows_of(specs: &[WindowSpec]) -> Result<Vec<WindowRule>, String> {
    let mut rules = specs
        .iter()
        .map(WindowSpec::rule)
        .collect::<Result<Vec<_>, _>>()?;
    sorted_distinct(&mut rules)?;
    Ok(rules)
}

/// Sorts windows shortest first; a period twice is refused.
pub fn sorted_distinct(rules: &mut [WindowRule]) -> Result<(), String> {
    rules.sort_by_key(|w| w.period);
    if let Some(pair) = rules.windows(2).find(|w| w[0].period == w[1].period) {
        return Err(format!(
            "the `{}` window is declared twice: one ceiling per period",
            pair[0].period
        ));
    }
    Ok(())
}

/// `1m=500`, `1d=10000@America/Los_Angeles`: a window as the CLI's
/// `--window` writes it.
pub fn parse_cli_window(text: &str) -> Result<WindowSpec, String> {
    let (period, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: a window is PERIOD=CEILING[@ZONE], e.g. 1m=500"))?;
    let (ceiling, zone) = match rest.split_once('@') {
        Some((ceiling, zone)) => (ceiling, Some(zone.to_string())),
        None => (rest, None),
    };
    let ceiling = ceiling
        .parse::<i64>()
        .map_err(|_| format!("`{text}`: the ceiling `{ceiling}` is not a whole number"))?;
    let spec = WindowSpec {
        period: period.to_string(),
        ceiling,
        zone,
    };
    spec.rule()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_that_divide_a_day_parse_to_their_canonical_spelling() {
        for (text, canonical) in [
            ("1s", "1s"),
            ("30s", "30s"),
            ("60s", "1m"),
            ("1m", "1m"),
            ("15m", "15m"),
            ("90m", "90m"),
            ("60m", "1h"),
            ("1h", "1h"),
            ("6h", "6h"),
            ("24h", "1d"),
            ("1d", "1d"),
            ("1mo", "1mo"),
        ] {
            assert_eq!(
                Period::parse(text).unwrap().to_string(),
                canonical,
                "{text}"
            );
        }
    }

    #[test]
    fn a_period_that_does_not_divide_a_day_or_is_no_period_is_refused() {
        for text in [
            "7m", "11s", "5h", "2d", "0s", "01m", "m", "1", "", "1w", "1y", "-1m", "1.5h",
            "999999s", "2mo",
        ] {
            assert!(Period::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn periods_order_by_length_with_the_month_last() {
        let mut periods: Vec<Period> = ["1mo", "1d", "1m", "1h", "15m"]
            .iter()
            .map(|p| Period::parse(p).unwrap())
            .collect();
        periods.sort();
        let names: Vec<String> = periods.iter().map(Period::to_string).collect();
        assert_eq!(names, ["1m", "15m", "1h", "1d", "1mo"]);
    }

    #[test]
    fn a_zone_goes_only_on_a_day_or_a_month() {
        let spec = |period: &str, zone: Option<&str>| WindowSpec {
            period: period.into(),
            ceiling: 10,
            zone: zone.map(str::to_string),
        };
        assert!(spec("1d", Some("America/Los_Angeles")).rule().is_ok());
        assert!(spec("1mo", Some("Europe/Paris")).rule().is_ok());
        assert!(spec("1h", Some("Europe/Paris")).rule().is_err());
        assert!(spec("1d", Some("Europe/Paris; DROP")).rule().is_err());
        assert_eq!(spec("1d", Some("UTC")).rule().unwrap().zone, None);
    }

    #[test]
    fn a_ceiling_below_zero_or_a_period_twice_is_refused() {
        let spec = |period: &str, ceiling| WindowSpec {
            period: period.into(),
            ceiling,
            zone: None,
        };
        assert!(spec("1m", -1).rule().is_err());
        assert!(spec("1m", 0).rule().is_ok());
        assert!(windows_of(&[spec("1m", 5), spec("60s", 6)]).is_err());
        let windows = windows_of(&[spec("1d", 100), spec("1m", 5)]).unwrap();
        assert_eq!(windows[0].period.to_string(), "1m");
    }

    #[test]
    fn the_cli_spelling_of_a_window() {
        let spec = parse_cli_window("1d=10000@America/Los_Angeles").unwrap();
        assert_eq!(spec.period, "1d");
        assert_eq!(spec.ceiling, 10_000);
        assert_eq!(spec.zone.as_deref(), Some("America/Los_Angeles"));
        assert!(parse_cli_window("1m").is_err());
        assert!(parse_cli_window("1m=x").is_err());
        assert!(parse_cli_window("1h=5@Europe/Paris").is_err());
    }

    fn counted(period: &str, ceiling: i64, count_before: i64, end_minutes: i64) -> WindowCount {
        let start = DateTime::<Utc>::UNIX_EPOCH;
        WindowCount {
            period: Period::parse(period).unwrap(),
            window_start: start,
            window_end: start + chrono::Duration::minutes(end_minutes),
            ceiling,
            count_before,
        }
    }

    #[test]
    fn the_fullest_window_bounds_what_is_left() {
        let windows = [counted("1m", 10, 4, 1), counted("1d", 100, 97, 1440)];
        assert_eq!(room(&windows, None), 3);
        assert_eq!(
            room(&windows, Some(50)),
            -47,
            "the day at half is past already"
        );
        let windows = [counted("1m", 10, 4, 1), counted("1d", 100, 40, 1440)];
        assert_eq!(room(&windows, Some(50)), 1, "5 - 4 of the minute at half");
        assert_eq!(room(&[], None), i64::MAX);
    }

    #[test]
    fn the_refusing_window_is_the_one_that_reopens_last() {
        let windows = [counted("1m", 10, 10, 1), counted("1d", 100, 95, 1440)];
        // The minute alone is full: it reopens first.
        let minute = refusing(&windows, None, 0, 1).unwrap();
        assert_eq!(minute.period.to_string(), "1m");
        // Both refuse 6: the day reopens last, and only then do they fit.
        let windows = [counted("1m", 10, 3, 1), counted("1d", 100, 95, 1440)];
        assert_eq!(
            refusing(&windows, None, 0, 6).unwrap().period.to_string(),
            "1d"
        );
        assert_eq!(refusing(&windows, None, 0, 5), None);
        // What the group spent before counts in every window.
        assert_eq!(
            refusing(&windows, None, 2, 5).unwrap().period.to_string(),
            "1d"
        );
    }

    #[test]
    fn answers_name_the_hour_else_the_shortest_window() {
        let day = WindowRule {
            period: Period::parse("1d").unwrap(),
            ceiling: 5000,
            zone: None,
        };
        let mut stacked = vec![WindowRule::hour(1000), day];
        let periods = |windows: &[WindowRule]| primary(windows.iter().map(|w| w.period));
        assert_eq!(periods(&stacked), Some(0));
        assert_eq!(hourly_ceiling(&stacked), Some(1000));
        stacked.remove(0);
        assert_eq!(periods(&stacked), Some(0));
        assert_eq!(hourly_ceiling(&stacked), None);
        stacked.clear();
        assert_eq!(periods(&stacked), None);
        let minute_then_hour = [Period::parse("1m").unwrap(), Period::HOUR];
        assert_eq!(
            primary(minute_then_hour),
            Some(1),
            "the hour, not the shortest"
        );
    }

    #[test]
    fn the_cli_spelling_reads_back() {
        for text in ["1m=500", "1d=10000@America/Los_Angeles"] {
            assert_eq!(parse_cli_window(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn headroom_is_a_share_of_each_window() {
        let window = WindowRule::hour(1000);
        assert_eq!(window.ceiling_for(None), 1000);
        assert_eq!(window.ceiling_for(Some(80)), 800);
    }
}
