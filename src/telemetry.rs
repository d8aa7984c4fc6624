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

/// The service's and the operator commands' logging: `info` unless
/// `RUST_LOG` says otherwise.
pub fn init(format: LogFormat, to: LogTo) {
    start(format, to, "info,sqlx=warn");
}

/// One subscriber: `RUST_LOG`, else `default_filter`; colours only on a
/// terminal.
fn start(format: LogFormat, to: LogTo, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
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
