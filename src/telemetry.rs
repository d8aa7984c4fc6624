//! Tracing subscriber: human-readable or JSON lines, filtered by RUST_LOG.

use std::io::IsTerminal;

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Where log lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogTo {
    /// The service's own stream (`serve`: its log is its output).
    Stdout,
    /// The operator's commands: their standard output is their answer alone
    /// (the key `KEY=$(quota-arbiter keys create …)` captures, a table), so
    /// a warning there (a statement slow under load) would become part of it.
    Stderr,
}

pub fn init(format: LogFormat, to: LogTo) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let (ansi, writer) = match to {
        LogTo::Stdout => (
            std::io::stdout().is_terminal(),
            BoxMakeWriter::new(std::io::stdout),
        ),
        LogTo::Stderr => (
            std::io::stderr().is_terminal(),
            BoxMakeWriter::new(std::io::stderr),
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(writer);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
}

/// For the shell worker's commands: warnings (the client's retries, a broken
/// variable) on stderr, so stdout carries only the answer.
pub fn init_stderr() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}
