//! Command line: one binary, `quota-arbiter`.

use clap::{Parser, Subcommand};

use crate::bench::BenchArgs;

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
    /// Measure decisions/s and latency over HTTP against a bare-upsert baseline.
    Bench(BenchArgs),
}
