//! Command line: one binary, `quota-arbiter`.

use clap::{Parser, Subcommand};

use crate::bench::BenchArgs;
use crate::catalog::Mode;

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
    /// Flip a flow's mode: observe, enforce or count.
    Flow {
        name: String,
        #[arg(value_parser = parse_mode)]
        mode: Mode,
        /// Create the flow on this quota if it does not exist yet.
        #[arg(long)]
        quota: Option<String>,
        /// Enforce mode: defer only this share (1-100) of over-ceiling decisions.
        #[arg(long)]
        percent: Option<i16>,
    },
    /// Create or update a quota.
    Quota {
        name: String,
        #[arg(long)]
        hourly_ceiling: i64,
    },
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
    /// Measure decisions/s and latency over HTTP against a bare-upsert baseline.
    Bench(BenchArgs),
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    text.parse()
}
