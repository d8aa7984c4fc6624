//! Command line: one binary, `quota-arbiter`.

use clap::{Args, Parser, Subcommand};

use crate::auth::Role;
use crate::domain::catalog::{Fallback, FlowPatch, Mode, Patch, QuotaPatch};
use crate::domain::window::{parse_cli_window, WindowSpec};
use crate::domain::{FlowName, QuotaName};

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
        /// What-if: as if the quota's `1h` window had a ceiling of N (changes nothing).
        #[arg(long)]
        ceiling: Option<i64>,
        /// What-if per window, repeatable: `--what-if 1d=8000` (changes nothing).
        #[arg(long = "what-if", value_name = "PERIOD=CEILING")]
        what_if: Vec<String>,
    },
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
pub struct FlowArgs {
    pub name: FlowName,
    /// observe, enforce or count.
    #[arg(value_parser = parse_mode)]
    pub mode: Option<Mode>,
    /// The quota the flow spends (required to create it); repeat it for a
    /// flow that spends several in each call, all or nothing
    /// (`--quota llm-requests --quota llm-tokens`): they replace the ones
    /// it spent.
    #[arg(long = "quota")]
    pub quotas: Vec<QuotaName>,
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
            quota: match self.quotas.as_slice() {
                [one] => Patch::Set(one.to_string()),
                _ => Patch::Keep,
            },
            quotas: match self.quotas.as_slice() {
                [] | [_] => Patch::Keep,
                several => Patch::Set(several.iter().map(|q| q.to_string()).collect()),
            },
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
    pub name: QuotaName,
    /// The `1h` window's ceiling.
    #[arg(long)]
    pub hourly_ceiling: Option<i64>,
    /// The quota's windows, replacing every one it has: PERIOD=CEILING or,
    /// for 1d and 1mo, PERIOD=CEILING@ZONE; repeat for each
    /// (`--window 1m=500 --window 1d=10000@America/Los_Angeles`).
    #[arg(long = "window", value_parser = parse_cli_window)]
    pub windows: Vec<WindowSpec>,
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
            windows: flag(
                clear,
                QuotaField::Windows,
                (!self.windows.is_empty()).then(|| self.windows.clone()),
            )?,
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
    Windows,
    Rate,
    Burst,
    Adaptive,
    MaxInFlight,
    Priority2Share,
    Priority3Share,
}

impl QuotaField {
    const ALL: [QuotaField; 8] = [
        QuotaField::HourlyCeiling,
        QuotaField::Windows,
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
            QuotaField::Windows => "windows",
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
