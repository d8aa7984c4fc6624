//! What an operator can set on a quota or a flow, and the rules every surface
//! shares. `PUT` replaces the whole object (a setting left out is off, or back
//! to its default); `PATCH` is a JSON merge patch (RFC 7396): a field left out
//! keeps its value, `null` removes it. The CLI's `quota` and `flow` commands
//! are patches too. Whatever the surface, the result goes through the same
//! checks, so one change means one thing everywhere.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{validate_cadence, validate_ceiling, Mode};
use crate::domain::window::{sorted_distinct, windows_of, Period, WindowRule, WindowSpec};
use crate::domain::{Patch, QuotaName};

/// Priority of a flow that names none.
pub const DEFAULT_PRIORITY: i16 = 2;

/// A quota's settings as stored: every limit resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaSettings {
    /// Its windows, shortest first, each period once; at least one.
    pub windows: Vec<WindowRule>,
    pub rate: Option<f64>,
    pub burst: Option<f64>,
    pub adaptive: bool,
    pub max_in_flight: Option<i32>,
    pub priority2_share: Option<i16>,
    pub priority3_share: Option<i16>,
}

impl QuotaSettings {
    /// A quota nobody sized yet: the default hour and nothing else.
    pub fn sized(hourly_ceiling: i64) -> Self {
        Self {
            windows: vec![WindowRule::hour(hourly_ceiling)],
            rate: None,
            burst: None,
            adaptive: true,
            max_in_flight: None,
            priority2_share: None,
            priority3_share: None,
        }
    }

    /// The `1h` window's ceiling (`hourly_ceiling` in answers and views).
    pub fn hourly_ceiling(&self) -> Option<i64> {
        crate::domain::window::hourly_ceiling(&self.windows)
    }

    /// The checks every quota passes, whichever surface wrote it.
    pub(crate) fn validated(mut self) -> Result<Self, String> {
        for window in &self.windows {
            validate_ceiling(
                &format!("the `{}` window's ceiling", window.period),
                window.ceiling,
            )?;
        }
        sorted_distinct(&mut self.windows)?;
        validate_cadence(self.rate, self.burst)?;
        if self
            .max_in_flight
            .is_some_and(|n| !(1..=10_000).contains(&n))
        {
            return Err("`max_in_flight` must be between 1 and 10000".into());
        }
        let share_ok = |s: Option<i16>| s.is_none_or(|p| (0..=100).contains(&p));
        if !share_ok(self.priority2_share) || !share_ok(self.priority3_share) {
            return Err("`priority2_share` and `priority3_share` are percentages (0-100)".into());
        }
        Ok(self)
    }
}

/// The windows a write declares: `windows` as given, with `hourly_ceiling`
/// as the `1h` window (saying both for the hour is refused: which one?);
/// none at all is the default hour.
fn declared_windows(
    windows: Vec<WindowRule>,
    hourly_ceiling: Option<i64>,
    default_ceiling: i64,
) -> Result<Vec<WindowRule>, String> {
    let mut windows = windows;
    if let Some(ceiling) = hourly_ceiling {
        validate_ceiling("hourly_ceiling", ceiling)?;
        windows.retain(|w| w.period != Period::HOUR);
        windows.push(WindowRule::hour(ceiling));
    }
    if windows.is_empty() {
        windows.push(WindowRule::hour(default_ceiling));
    }
    Ok(windows)
}

/// A `1h` window in `windows` beside `hourly_ceiling`: two ceilings for one hour.
fn hour_said_twice(specs: &[WindowSpec]) -> Result<(), String> {
    let hour = Period::HOUR.to_string();
    if specs
        .iter()
        .any(|spec| Period::parse(&spec.period).is_ok_and(|p| p.to_string() == hour))
    {
        return Err("`hourly_ceiling` and a `1h` window both set the hour: give one".into());
    }
    Ok(())
}

/// A whole quota, as `PUT /v1/quotas/{name}` or a config file's
/// `[quotas.NAME]` declares it: a limit left out is off.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// The `1h` window's ceiling: slots per UTC hour. A quota that declares
    /// neither this nor `windows` gets QUOTA_HOURLY_CEILING. Below 1 refuses everything.
    #[schema(minimum = 0, maximum = 9007199254740992_i64)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub hourly_ceiling: Option<i64>,
    /// Stacked windows (design.md §12): a reservation spends every one or none.
    pub windows: Option<Vec<WindowSpec>>,
    /// Cadence: sustained tokens per second (with `burst`).
    pub rate: Option<f64>,
    /// Cadence: bucket size, at least 1 (with `rate`).
    pub burst: Option<f64>,
    /// Shrink the cadence on upstream errors (default true).
    pub adaptive: Option<bool>,
    /// In-flight places; a grant holds a lease on one.
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub max_in_flight: Option<i32>,
    /// Headroom: percent of every window's ceiling open to priority-2 flows.
    #[schema(minimum = 0, maximum = 100)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub priority2_share: Option<i16>,
    /// Headroom: percent of every window's ceiling open to priority-3 flows.
    #[schema(minimum = 0, maximum = 100)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub priority3_share: Option<i16>,
}

impl QuotaLimits {
    /// The settings that replace the stored ones, `default_ceiling` standing
    /// in for a quota that declares no window.
    pub fn settings(&self, default_ceiling: i64) -> Result<QuotaSettings, String> {
        let specs = self.windows.as_deref().unwrap_or_default();
        if self.hourly_ceiling.is_some() {
            hour_said_twice(specs)?;
        }
        QuotaSettings {
            windows: declared_windows(windows_of(specs)?, self.hourly_ceiling, default_ceiling)?,
            rate: self.rate,
            burst: self.burst,
            adaptive: self.adaptive.unwrap_or(true),
            max_in_flight: self.max_in_flight,
            priority2_share: self.priority2_share,
            priority3_share: self.priority3_share,
        }
        .validated()
    }
}

/// `PATCH /v1/quotas/{name}` and `quota-arbiter quota NAME …`: only the
/// fields given change; `null` turns a limit off. `windows` replaces every
/// window (`null`: back to the hour alone); `hourly_ceiling` sets the `1h`
/// window (`null` removes it). A quota left without windows gets the hour
/// at QUOTA_HOURLY_CEILING.
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaPatch {
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = Option<i64>, nullable, minimum = 0, maximum = 9007199254740992_i64)]
    pub hourly_ceiling: Patch<i64>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<WindowSpec>>, nullable)]
    pub windows: Patch<Vec<WindowSpec>>,
    #[serde(default)]
    #[schema(value_type = Option<f64>, nullable)]
    pub rate: Patch<f64>,
    #[serde(default)]
    #[schema(value_type = Option<f64>, nullable)]
    pub burst: Patch<f64>,
    #[serde(default)]
    #[schema(value_type = Option<bool>, nullable)]
    pub adaptive: Patch<bool>,
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = Option<i32>, nullable, minimum = 1, maximum = 10000)]
    pub max_in_flight: Patch<i32>,
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = Option<i16>, nullable, minimum = 0, maximum = 100)]
    pub priority2_share: Patch<i16>,
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = Option<i16>, nullable, minimum = 0, maximum = 100)]
    pub priority3_share: Patch<i16>,
}

impl QuotaPatch {
    /// The settings after the patch; a quota that does not exist yet starts
    /// from [`QuotaSettings::sized`].
    pub(crate) fn applied_to(
        self,
        current: Option<QuotaSettings>,
        default_ceiling: i64,
    ) -> Result<QuotaSettings, String> {
        let current = current.unwrap_or_else(|| QuotaSettings::sized(default_ceiling));
        let windows = match &self.windows {
            Patch::Keep => current.windows.clone(),
            Patch::Remove => vec![WindowRule::hour(
                current.hourly_ceiling().unwrap_or(default_ceiling),
            )],
            Patch::Set(specs) => {
                if matches!(self.hourly_ceiling, Patch::Set(_)) {
                    hour_said_twice(specs)?;
                }
                windows_of(specs)?
            }
        };
        let windows = match self.hourly_ceiling {
            Patch::Keep => declared_windows(windows, None, default_ceiling)?,
            Patch::Set(ceiling) => declared_windows(windows, Some(ceiling), default_ceiling)?,
            Patch::Remove => {
                let rest = windows.into_iter().filter(|w| w.period != Period::HOUR);
                declared_windows(rest.collect(), None, default_ceiling)?
            }
        };
        QuotaSettings {
            windows,
            rate: self.rate.applied_to(current.rate),
            burst: self.burst.applied_to(current.burst),
            adaptive: self.adaptive.or_default(current.adaptive, true),
            max_in_flight: self.max_in_flight.applied_to(current.max_in_flight),
            priority2_share: self.priority2_share.applied_to(current.priority2_share),
            priority3_share: self.priority3_share.applied_to(current.priority3_share),
        }
        .validated()
    }
}

/// What a worker's client does for a flow when the arbiter is unreachable
/// (design.md §12). New flows have none: the call fails, as it always did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// No local decisions: the client reports the arbiter unavailable.
    #[default]
    Off,
    /// The client decides locally at its last known share of the quota,
    /// waits rather than refuses, and reports those slots when it can.
    Local,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Off => "off",
            Fallback::Local => "local",
        }
    }
}

impl std::str::FromStr for Fallback {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Fallback::Off),
            "local" => Ok(Fallback::Local),
            other => Err(format!("unknown fallback `{other}` (off or local)")),
        }
    }
}

/// A flow's settings as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSettings {
    /// The quota its answers name.
    pub quota: QuotaName,
    /// The quotas it spends besides, in order (design.md §12).
    pub further_quotas: Vec<QuotaName>,
    pub mode: Mode,
    pub priority: i16,
    /// `None`: the whole over-ceiling share is deferred (100 %).
    pub enforce_percent: Option<i16>,
    pub fallback: Fallback,
}

impl FlowSettings {
    /// The checks every flow passes, whichever surface wrote it. A percent
    /// only means something in enforce mode, and 100 is stored as "all".
    pub(crate) fn validated(mut self) -> Result<Self, String> {
        if self.further_quotas.len() + 1 > MAX_FLOW_QUOTAS {
            return Err(format!(
                "a flow spends at most {MAX_FLOW_QUOTAS} quotas in one call"
            ));
        }
        let mut named: Vec<&str> = self.quotas().map(QuotaName::as_str).collect();
        named.sort_unstable();
        if let Some(twice) = named.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(format!("`quotas` names `{}` twice", twice[0]));
        }
        if !(1..=9).contains(&self.priority) {
            return Err("`priority` must be between 1 and 9".into());
        }
        if let Some(percent) = self.enforce_percent {
            if !(1..=100).contains(&percent) {
                return Err("`enforce_percent` must be between 1 and 100".into());
            }
            if self.mode != Mode::Enforce {
                return Err(format!(
                    "`enforce_percent` applies to mode enforce only, not {}",
                    self.mode.as_str()
                ));
            }
        }
        if self.enforce_percent == Some(100) {
            self.enforce_percent = None;
        }
        Ok(self)
    }
}

impl FlowSettings {
    /// A flow of these settings that spends `quotas` (the first is the one
    /// its answers name).
    fn spending(mut self, mut quotas: Vec<QuotaName>) -> Result<Self, String> {
        if quotas.is_empty() {
            return Err("`quotas` names at least one quota".into());
        }
        self.quota = quotas.remove(0);
        self.further_quotas = quotas;
        Ok(self)
    }

    /// Every quota the flow spends, its own first.
    pub fn quotas(&self) -> impl Iterator<Item = &QuotaName> {
        std::iter::once(&self.quota).chain(&self.further_quotas)
    }
}

/// How many quotas one flow may spend in a call (the table's CHECK allows
/// seven further ones).
pub const MAX_FLOW_QUOTAS: usize = 8;

/// What a flow's body says it spends: one `quota`, or several `quotas`.
pub(crate) fn quotas_named(
    quota: Option<String>,
    quotas: Option<Vec<String>>,
) -> Result<Vec<QuotaName>, String> {
    match (quota, quotas) {
        (Some(_), Some(_)) => Err("give `quota` or `quotas`, not both".into()),
        (Some(quota), None) => Ok(vec![quota_named(quota)?]),
        (None, Some(quotas)) => quotas
            .into_iter()
            .map(|q| QuotaName::parse(q).map_err(|why| format!("`quotas` {why}")))
            .collect(),
        (None, None) => Err("name the quota the flow spends (`quota`, or `quotas`)".into()),
    }
}

/// A whole flow, as `PUT /v1/flows/{name}` declares it: a new or replaced
/// flow observes unless `mode` says otherwise.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowBody {
    /// The quota the flow spends; it must exist unless `create_quota` is
    /// true. Give it or `quotas`.
    #[serde(default)]
    #[schema(schema_with = crate::domain::input::schema::optional_name)]
    pub quota: Option<String>,
    /// The quotas the flow spends, every one in each call, all or nothing
    /// (design.md §12); the first is the one answers name. Instead of
    /// `quota`; each must exist.
    #[serde(default)]
    #[schema(schema_with = crate::domain::input::schema::quotas)]
    pub quotas: Option<Vec<String>>,
    /// Default `observe`.
    pub mode: Option<Mode>,
    /// 1 (most important) to 9; default 2.
    #[schema(minimum = 1, maximum = 9)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub priority: Option<i16>,
    /// Enforce mode only: share of over-ceiling decisions actually deferred
    /// (default 100 = all).
    #[schema(minimum = 1, maximum = 100)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub enforce_percent: Option<i16>,
    /// What a worker's client does when the arbiter is unreachable; default `off`.
    pub fallback: Option<Fallback>,
    /// Create the quota (with the default ceiling) when it does not exist.
    #[serde(default)]
    pub create_quota: bool,
}

impl FlowBody {
    pub fn settings(self) -> Result<FlowSettings, String> {
        let quotas = quotas_named(self.quota, self.quotas)?;
        FlowSettings {
            quota: quotas[0].clone(),
            further_quotas: Vec::new(),
            mode: self.mode.unwrap_or(Mode::Observe),
            priority: self.priority.unwrap_or(DEFAULT_PRIORITY),
            enforce_percent: self.enforce_percent,
            fallback: self.fallback.unwrap_or_default(),
        }
        .spending(quotas)?
        .validated()
    }
}

/// The quota a flow's body names, parsed.
fn quota_named(quota: String) -> Result<QuotaName, String> {
    QuotaName::parse(quota).map_err(|why| format!("`quota` {why}"))
}

/// `PATCH /v1/flows/{name}` and `quota-arbiter flow NAME …`: only the fields
/// given change. Setting `mode` without `enforce_percent` means the whole
/// mode: a flow enforced at 30 % and flipped to `enforce` is enforced fully.
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowPatch {
    /// The one quota the flow spends from now on (or `quotas`); required
    /// to create the flow; it must exist unless `create_quota` is true.
    #[serde(default)]
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub quota: Patch<String>,
    /// The quotas the flow spends from now on, every one in each call
    /// (or `quota`).
    #[serde(default)]
    #[schema(schema_with = crate::domain::input::schema::quotas)]
    pub quotas: Patch<Vec<String>>,
    /// `null`: back to `observe`.
    #[serde(default)]
    #[schema(value_type = Option<Mode>, nullable)]
    pub mode: Patch<Mode>,
    /// `null`: back to 2.
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = Option<i16>, nullable, minimum = 1, maximum = 9)]
    pub priority: Patch<i16>,
    /// `null`: all (100 %).
    #[serde(default, deserialize_with = "crate::domain::input::integer::patch")]
    #[schema(value_type = Option<i16>, nullable, minimum = 1, maximum = 100)]
    pub enforce_percent: Patch<i16>,
    /// `null`: back to `off`.
    #[serde(default)]
    #[schema(value_type = Option<Fallback>, nullable)]
    pub fallback: Patch<Fallback>,
    #[serde(default)]
    pub create_quota: bool,
}

/// Why a flow patch cannot be applied.
#[derive(Debug, PartialEq)]
pub enum FlowPatchError {
    /// No such flow, and the patch does not name a quota to create it on.
    NoSuchFlow,
    Invalid(String),
}

impl FlowPatch {
    pub(crate) fn applied_to(
        self,
        current: Option<FlowSettings>,
    ) -> Result<FlowSettings, FlowPatchError> {
        let quotas = match (self.quota, self.quotas) {
            (Patch::Remove, _) | (_, Patch::Remove) => {
                return Err(FlowPatchError::Invalid(
                    "`quota` cannot be removed: a flow spends a quota".into(),
                ))
            }
            (Patch::Set(quota), Patch::Keep) => Some(quotas_named(Some(quota), None)),
            (Patch::Keep, Patch::Set(quotas)) => Some(quotas_named(None, Some(quotas))),
            (Patch::Set(quota), Patch::Set(quotas)) => {
                Some(quotas_named(Some(quota), Some(quotas)))
            }
            (Patch::Keep, Patch::Keep) => None,
        }
        .transpose()
        .map_err(FlowPatchError::Invalid)?;
        let current = match (current, &quotas) {
            (Some(current), _) => current,
            (None, Some(quotas)) if !quotas.is_empty() => FlowSettings {
                quota: quotas[0].clone(),
                further_quotas: Vec::new(),
                mode: Mode::Observe,
                priority: DEFAULT_PRIORITY,
                enforce_percent: None,
                fallback: Fallback::Off,
            },
            (None, _) => return Err(FlowPatchError::NoSuchFlow),
        };
        let percent = if self.enforce_percent.is_kept() && !self.mode.is_kept() {
            Patch::Remove
        } else {
            self.enforce_percent
        };
        let quotas = quotas.unwrap_or_else(|| current.quotas().cloned().collect());
        FlowSettings {
            quota: current.quota.clone(),
            further_quotas: Vec::new(),
            mode: self.mode.or_default(current.mode, Mode::Observe),
            priority: self.priority.or_default(current.priority, DEFAULT_PRIORITY),
            enforce_percent: percent.applied_to(current.enforce_percent),
            fallback: self.fallback.or_default(current.fallback, Fallback::Off),
        }
        .spending(quotas)
        .and_then(FlowSettings::validated)
        .map_err(FlowPatchError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(mode: Mode, percent: Option<i16>) -> FlowSettings {
        FlowSettings {
            quota: QuotaName::parse("ppf").unwrap(),
            further_quotas: Vec::new(),
            mode,
            priority: 1,
            enforce_percent: percent,
            fallback: Fallback::Off,
        }
    }

    fn patch(json: &str) -> FlowPatch {
        serde_json::from_str(json).expect("a valid patch")
    }

    #[test]
    fn a_mode_set_without_a_percent_is_the_whole_mode() {
        let partial = flow(Mode::Enforce, Some(30));
        let full = patch(r#"{"mode": "enforce"}"#).applied_to(Some(partial.clone()));
        assert_eq!(full, Ok(flow(Mode::Enforce, None)));
        let back = patch(r#"{"mode": "observe"}"#).applied_to(Some(partial.clone()));
        assert_eq!(back, Ok(flow(Mode::Observe, None)));
        // A change that does not touch the mode keeps the percent.
        let moved = patch(r#"{"priority": 3}"#).applied_to(Some(partial));
        assert_eq!(
            moved.map(|f| (f.priority, f.enforce_percent)),
            Ok((3, Some(30)))
        );
    }

    #[test]
    fn a_percent_outside_enforce_is_refused() {
        for json in [
            r#"{"mode": "observe", "enforce_percent": 30}"#,
            r#"{"enforce_percent": 30}"#,
        ] {
            let refused = patch(json).applied_to(Some(flow(Mode::Observe, None)));
            assert!(matches!(refused, Err(FlowPatchError::Invalid(_))), "{json}");
        }
        let body: FlowBody =
            serde_json::from_str(r#"{"quota": "ppf", "enforce_percent": 30}"#).unwrap();
        assert!(body.settings().is_err(), "PUT: a new flow observes");
    }

    #[test]
    fn fallback_is_off_unless_asked_and_kept_by_other_changes() {
        let body: FlowBody = serde_json::from_str(r#"{"quota": "ppf"}"#).unwrap();
        assert_eq!(body.settings().unwrap().fallback, Fallback::Off);
        let body: FlowBody =
            serde_json::from_str(r#"{"quota": "ppf", "fallback": "local"}"#).unwrap();
        let local = body.settings().unwrap();
        assert_eq!(local.fallback, Fallback::Local);
        let moved = patch(r#"{"mode": "enforce", "priority": 3}"#).applied_to(Some(local.clone()));
        assert_eq!(moved.map(|f| f.fallback), Ok(Fallback::Local));
        let off = patch(r#"{"fallback": null}"#).applied_to(Some(local.clone()));
        assert_eq!(off.map(|f| f.fallback), Ok(Fallback::Off));
        let on = patch(r#"{"fallback": "local"}"#).applied_to(Some(flow(Mode::Observe, None)));
        assert_eq!(on.map(|f| f.fallback), Ok(Fallback::Local));
        assert!(serde_json::from_str::<FlowPatch>(r#"{"fallback": "remote"}"#).is_err());
    }

    #[test]
    fn a_percent_of_100_is_stored_as_all() {
        let set = patch(r#"{"mode": "enforce", "enforce_percent": 100}"#)
            .applied_to(Some(flow(Mode::Observe, None)));
        assert_eq!(set, Ok(flow(Mode::Enforce, None)));
    }

    #[test]
    fn a_flow_is_created_only_with_its_quota() {
        assert_eq!(
            patch(r#"{"mode": "enforce"}"#).applied_to(None),
            Err(FlowPatchError::NoSuchFlow)
        );
        let created = patch(r#"{"quota": "ppf"}"#).applied_to(None).unwrap();
        assert_eq!((created.mode, created.priority), (Mode::Observe, 2));
        assert!(matches!(
            patch(r#"{"quota": null}"#).applied_to(Some(flow(Mode::Observe, None))),
            Err(FlowPatchError::Invalid(_))
        ));
    }

    #[test]
    fn a_quota_patch_changes_only_what_it_names() {
        let stored = QuotaSettings {
            rate: Some(2.0),
            burst: Some(20.0),
            max_in_flight: Some(4),
            ..QuotaSettings::sized(3600)
        };
        let json = r#"{"hourly_ceiling": 4000}"#;
        let patched: QuotaPatch = serde_json::from_str(json).unwrap();
        let after = patched.applied_to(Some(stored.clone()), 1000).unwrap();
        assert_eq!(
            after,
            QuotaSettings {
                windows: vec![WindowRule::hour(4000)],
                ..stored.clone()
            }
        );
        let off: QuotaPatch =
            serde_json::from_str(r#"{"rate": null, "burst": null, "hourly_ceiling": null}"#)
                .unwrap();
        let after = off.applied_to(Some(stored.clone()), 1000).unwrap();
        assert_eq!(
            (after.rate, after.burst, after.hourly_ceiling()),
            (None, None, Some(1000))
        );
        assert_eq!(after.max_in_flight, Some(4));
        let half: QuotaPatch = serde_json::from_str(r#"{"rate": null}"#).unwrap();
        assert!(
            half.applied_to(Some(stored), 1000).is_err(),
            "rate and burst go together"
        );
    }

    /// Either share out of range is refused alone, whatever the other is.
    #[test]
    fn each_headroom_share_is_checked_on_its_own() {
        let shares = |priority2_share, priority3_share| QuotaLimits {
            priority2_share,
            priority3_share,
            ..QuotaLimits::default()
        };
        for (p2, p3) in [(Some(101), None), (None, Some(101)), (Some(-1), Some(50))] {
            assert!(shares(p2, p3).settings(1000).is_err(), "{p2:?} {p3:?}");
        }
        assert!(shares(Some(0), Some(100)).settings(1000).is_ok());
    }

    fn windows(json: &str) -> Vec<String> {
        let put: QuotaLimits = serde_json::from_str(json).unwrap();
        let settings = put.settings(1000).unwrap();
        settings
            .windows
            .iter()
            .map(|w| WindowSpec::from(w).to_string())
            .collect()
    }

    #[test]
    fn a_quota_declares_its_windows_and_hourly_ceiling_is_the_hour() {
        assert_eq!(windows("{}"), ["1h=1000"]);
        assert_eq!(windows(r#"{"hourly_ceiling": 50}"#), ["1h=50"]);
        assert_eq!(
            windows(
                r#"{"windows": [{"period": "1d", "ceiling": 10000, "zone": "America/Los_Angeles"},
                                {"period": "1m", "ceiling": 500}]}"#
            ),
            ["1m=500", "1d=10000@America/Los_Angeles"]
        );
        assert_eq!(
            windows(r#"{"hourly_ceiling": 50, "windows": [{"period": "1m", "ceiling": 5}]}"#),
            ["1m=5", "1h=50"]
        );
        for refused in [
            r#"{"hourly_ceiling": 50, "windows": [{"period": "60m", "ceiling": 5}]}"#,
            r#"{"windows": [{"period": "1m", "ceiling": 5}, {"period": "60s", "ceiling": 6}]}"#,
            r#"{"windows": [{"period": "7m", "ceiling": 5}]}"#,
            r#"{"windows": [{"period": "1h", "ceiling": 5, "zone": "Europe/Paris"}]}"#,
            r#"{"windows": [{"period": "1m", "ceiling": -1}]}"#,
        ] {
            let put: QuotaLimits = serde_json::from_str(refused).unwrap();
            assert!(put.settings(1000).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_windows_patch_replaces_them_and_an_hourly_patch_sets_the_hour() {
        let stored = QuotaLimits {
            windows: Some(vec![
                WindowSpec {
                    period: "1m".into(),
                    ceiling: 5,
                    zone: None,
                },
                WindowSpec {
                    period: "1h".into(),
                    ceiling: 100,
                    zone: None,
                },
            ]),
            ..QuotaLimits::default()
        }
        .settings(1000)
        .unwrap();
        let patched = |json: &str| {
            let patch: QuotaPatch = serde_json::from_str(json).unwrap();
            patch.applied_to(Some(stored.clone()), 1000).map(|s| {
                s.windows
                    .iter()
                    .map(|w| format!("{}={}", w.period, w.ceiling))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            patched(r#"{"hourly_ceiling": 7}"#).unwrap(),
            ["1m=5", "1h=7"]
        );
        assert_eq!(patched(r#"{"hourly_ceiling": null}"#).unwrap(), ["1m=5"]);
        assert_eq!(patched(r#"{"windows": null}"#).unwrap(), ["1h=100"]);
        assert_eq!(
            patched(r#"{"windows": [{"period": "1d", "ceiling": 9}]}"#).unwrap(),
            ["1d=9"]
        );
        assert_eq!(patched(r#"{"windows": []}"#).unwrap(), ["1h=1000"]);
        assert!(
            patched(r#"{"windows": [{"period": "1h", "ceiling": 9}], "hourly_ceiling": 3}"#)
                .is_err()
        );
    }

    #[test]
    fn a_put_replaces_every_limit() {
        let put: QuotaLimits = serde_json::from_str(r#"{"hourly_ceiling": 4000}"#).unwrap();
        assert_eq!(put.settings(1000), Ok(QuotaSettings::sized(4000)));
    }
}
