//! Command line: one binary, `quota-arbiter`.

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::auth::Role;
use crate::catalog::{Fallback, FlowPatch, Mode, Patch, QuotaPatch};

#[derive(Debug, Parser)]
#[command(
    name = "quota-arbiter",
    version,
    about = "Share a third-party quota across many workers, with PostgreSQL as the arbiter"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (creates the database and applies migrations first).
    Serve,
    /// Create the database if missing and apply migrations, then exit.
    Migrate,
    /// List flows with their quota, mode and priority.
    Flows,
    /// Create a flow or change what is given (like PATCH): a mode without
    /// --percent is the whole mode.
    Flow(FlowArgs),
    /// Create a quota or change what is given (like PATCH).
    Quota(QuotaArgs),
    /// Recent windows with count, ceiling and tallies by outcome.
    Windows {
        #[arg(long)]
        quota: Option<String>,
        /// Hours to look back, the current one included.
        #[arg(long, default_value_t = 24)]
        last: i32,
    },
    /// What enforcing each flow still in observe mode would have deferred.
    Report {
        #[arg(long)]
        quota: Option<String>,
        /// Period to look back (7d, 36h, ...).
        #[arg(long, default_value = "7d")]
        since: String,
        /// What-if: as if the quota's ceiling were N (changes nothing).
        #[arg(long)]
        ceiling: Option<i64>,
    },
    /// A shell worker's question: may I emit now? Through the worker client
    /// (QUOTA_ARBITER_URL, QUOTA_RETRY_*). Exit 0: emit (granted, bypassed,
    /// unthrottled); 75: deferred, the seconds to wait on stdout; 69: the
    /// arbiter is unavailable after the retries; 64: bad usage.
    Reserve(ReserveArgs),
    /// API keys for `auth = "keys"`: create (shown once), list, revoke.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key and print it once: only its hash is stored.
    Create {
        /// worker, operator or admin.
        #[arg(long, value_parser = parse_role)]
        role: Role,
        #[arg(long)]
        tenant: Option<String>,
        /// What the key is for, to recognise it in `keys list`.
        #[arg(long)]
        name: Option<String>,
    },
    /// Every key with its role, tenant and state; never a secret.
    List,
    /// Revoke a key by id: every replica refuses it within about a second.
    Revoke { id: i64 },
}

fn parse_role(text: &str) -> Result<Role, String> {
    text.parse()
}

#[derive(Debug, Args)]
pub struct ReserveArgs {
    pub flow: String,
    /// Slots to reserve, all or nothing.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub count: Option<u32>,
    /// When the work is due: an RFC 3339 time or a delay from now (90s, 2h).
    #[arg(long, value_parser = parse_deadline)]
    pub deadline: Option<DateTime<Utc>>,
    /// The caller's reference, echoed in the arbiter's logs.
    #[arg(long = "ref")]
    pub reference: Option<String>,
    /// Wait out deferrals until the arbiter lets the worker emit.
    #[arg(long)]
    pub wait: bool,
}

fn parse_deadline(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let delay = humantime::parse_duration(text)
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time nor a delay like 90s"))?;
    chrono::Duration::from_std(delay)
        .ok()
        .and_then(|delay| Utc::now().checked_add_signed(delay))
        .ok_or_else(|| format!("`{text}` is too far away"))
}

/// Bad usage of `reserve` exits 64 (EX_USAGE), as shell workers expect of
/// it; the operator commands keep clap's 2. Help and version exit 0.
pub fn usage_exit_code(error: &clap::Error, args: &[std::ffi::OsString]) -> u8 {
    if !error.use_stderr() {
        0
    } else if args.get(1).is_some_and(|command| command == "reserve") {
        EX_USAGE
    } else {
        error.exit_code().try_into().unwrap_or(2)
    }
}

/// sysexits.h: the command was used incorrectly.
pub const EX_USAGE: u8 = 64;

#[derive(Debug, Args)]
pub struct FlowArgs {
    pub name: String,
    /// observe, enforce or count.
    #[arg(value_parser = parse_mode)]
    pub mode: Option<Mode>,
    /// The quota the flow spends (required to create it).
    #[arg(long)]
    pub quota: Option<String>,
    /// Enforce mode only: defer this share (1-100) of over-ceiling decisions.
    #[arg(long)]
    pub percent: Option<i16>,
    /// 1 (most important) to 9.
    #[arg(long)]
    pub priority: Option<i16>,
    /// What workers' clients do when the arbiter is unreachable: off, or
    /// local (decide at their last known share).
    #[arg(long, value_parser = parse_fallback)]
    pub fallback: Option<Fallback>,
    /// Create the quota (default ceiling) if it does not exist.
    #[arg(long)]
    pub create_quota: bool,
}

impl FlowArgs {
    pub fn patch(&self) -> FlowPatch {
        FlowPatch {
            quota: self.quota.clone().into(),
            mode: self.mode.into(),
            priority: self.priority.into(),
            enforce_percent: self.percent.into(),
            fallback: self.fallback.into(),
            create_quota: self.create_quota,
        }
    }
}

#[derive(Debug, Args)]
pub struct QuotaArgs {
    pub name: String,
    #[arg(long)]
    pub hourly_ceiling: Option<i64>,
    /// Cadence: sustained tokens per second (with --burst).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Cadence: bucket size (with --rate).
    #[arg(long)]
    pub burst: Option<f64>,
    /// Shrink the cadence on upstream errors.
    #[arg(long)]
    pub adaptive: Option<bool>,
    #[arg(long)]
    pub max_in_flight: Option<i32>,
    #[arg(long)]
    pub priority2_share: Option<i16>,
    #[arg(long)]
    pub priority3_share: Option<i16>,
    /// Turn settings off, as `null` does in a PATCH: --clear rate,burst
    #[arg(long, value_delimiter = ',', value_parser = parse_quota_field)]
    pub clear: Vec<QuotaField>,
}

impl QuotaArgs {
    /// The merge patch these flags say; a setting both given and cleared is refused.
    pub fn patch(&self) -> Result<QuotaPatch, String> {
        let clear = &self.clear;
        Ok(QuotaPatch {
            hourly_ceiling: flag(clear, QuotaField::HourlyCeiling, self.hourly_ceiling)?,
            rate: flag(clear, QuotaField::Rate, self.rate)?,
            burst: flag(clear, QuotaField::Burst, self.burst)?,
            adaptive: flag(clear, QuotaField::Adaptive, self.adaptive)?,
            max_in_flight: flag(clear, QuotaField::MaxInFlight, self.max_in_flight)?,
            priority2_share: flag(clear, QuotaField::Priority2Share, self.priority2_share)?,
            priority3_share: flag(clear, QuotaField::Priority3Share, self.priority3_share)?,
        })
    }
}

/// One field of the patch: given, cleared, or left as it is.
fn flag<T>(clear: &[QuotaField], field: QuotaField, value: Option<T>) -> Result<Patch<T>, String> {
    match (clear.contains(&field), value) {
        (true, Some(_)) => Err(format!("{} is both given and cleared", field.name())),
        (true, None) => Ok(Patch::Remove),
        (false, value) => Ok(value.into()),
    }
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    text.parse()
}

fn parse_fallback(text: &str) -> Result<Fallback, String> {
    text.parse()
}

/// A quota setting `--clear` can turn off, named as in the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaField {
    HourlyCeiling,
    Rate,
    Burst,
    Adaptive,
    MaxInFlight,
    Priority2Share,
    Priority3Share,
}

impl QuotaField {
    const ALL: [QuotaField; 7] = [
        QuotaField::HourlyCeiling,
        QuotaField::Rate,
        QuotaField::Burst,
        QuotaField::Adaptive,
        QuotaField::MaxInFlight,
        QuotaField::Priority2Share,
        QuotaField::Priority3Share,
    ];

    fn name(self) -> &'static str {
        match self {
            QuotaField::HourlyCeiling => "hourly_ceiling",
            QuotaField::Rate => "rate",
            QuotaField::Burst => "burst",
            QuotaField::Adaptive => "adaptive",
            QuotaField::MaxInFlight => "max_in_flight",
            QuotaField::Priority2Share => "priority2_share",
            QuotaField::Priority3Share => "priority3_share",
        }
    }
}

fn parse_quota_field(text: &str) -> Result<QuotaField, String> {
    let name = text.replace('-', "_");
    QuotaField::ALL
        .into_iter()
        .find(|field| field.name() == name)
        .ok_or_else(|| {
            let known: Vec<_> = QuotaField::ALL.iter().map(|f| f.name()).collect();
            format!("unknown setting `{text}` ({})", known.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_a_time_or_a_delay_from_now() {
        let at = parse_deadline("2026-11-30T15:30:00+01:00").unwrap();
        assert_eq!(at, "2026-11-30T14:30:00Z".parse::<DateTime<Utc>>().unwrap());
        let before = Utc::now();
        let due = parse_deadline("90s").unwrap();
        let ahead = (due - before).num_milliseconds();
        assert!((90_000..91_000).contains(&ahead), "{ahead}");
        assert!(parse_deadline("soonish").is_err());
    }
}
