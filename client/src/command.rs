//! `quota-arbiter-client reserve`: a shell worker's "may I emit now?"
//! through the worker client, answered by the exit status (sysexits.h
//! codes). The binary (`src/bin/quota-arbiter-client.rs`) is this module's
//! [`run`] with the process's arguments and environment.

use std::ffi::OsString;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::{Client, Decision, Error, Reserve, Settings};

/// sysexits.h: the command was used incorrectly.
pub const EX_USAGE: u8 = 64;
/// The arbiter could not be asked: unreachable or failing after the retries.
pub const EX_UNAVAILABLE: u8 = 69;
/// Deferred: ask again after the seconds printed on stdout.
pub const EX_TEMPFAIL: u8 = 75;

/// Ask quota-arbiter before an emission, from a shell.
#[derive(Debug, Parser)]
#[command(name = "quota-arbiter-client", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A shell worker's question: may I emit now? Through the worker client
    /// (QUOTA_ARBITER_URL, QUOTA_ARBITER_KEY, QUOTA_RETRY_*). Exit 0: emit
    /// (granted, bypassed, unthrottled); 75: deferred, the seconds to wait on
    /// stdout; 69: the arbiter is unavailable after the retries; 64: bad
    /// usage.
    Reserve(ReserveArgs),
}

#[derive(Debug, Args)]
struct ReserveArgs {
    flow: String,
    /// Slots to reserve, all or nothing.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: Option<u32>,
    /// When the work is due: an RFC 3339 time or a delay from now (90s, 2h).
    #[arg(long, value_parser = parse_deadline)]
    deadline: Option<DateTime<Utc>>,
    /// The caller's reference, echoed in the arbiter's logs.
    #[arg(long = "ref")]
    reference: Option<String>,
    /// Wait out deferrals until the arbiter lets the worker emit.
    #[arg(long)]
    wait: bool,
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

/// The binary: the process's arguments and `QUOTA_*` variables in, the
/// answer on stdout and the exit status out. Warnings (a broken variable, a
/// retry) go to stderr, so stdout is the answer alone.
pub fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let answer = match runtime {
        Ok(runtime) => runtime.block_on(run(std::env::args_os(), Settings::from_env())),
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            Answer {
                status: EX_UNAVAILABLE,
                stdout: None,
            }
        }
    };
    if let Some(line) = &answer.stdout {
        println!("{line}");
    }
    std::process::ExitCode::from(answer.status)
}

/// The command line as clap reads it (for its reference page).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// What the command says: its exit status and its standard output.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u8,
    pub stdout: Option<String>,
}

/// The command for `args` (the program's name first) with the client's
/// `settings`. Usage errors and help are printed here, as clap writes them;
/// a decision's stdout is the caller's to print.
pub async fn run(args: impl IntoIterator<Item = OsString>, settings: Settings) -> Answer {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            let status = if error.use_stderr() { EX_USAGE } else { 0 };
            return Answer {
                status,
                stdout: None,
            };
        }
    };
    let Command::Reserve(args) = cli.command;
    // One call and gone: no share stream (it would count this process as a
    // live client of the quota for a moment), so no local fallback either.
    let client = Client::builder()
        .settings(settings)
        .share_stream(false)
        .build();
    match client {
        Ok(client) => {
            let request = request(&args);
            let decision = if args.wait {
                client.acquire(&request).await
            } else {
                client.reserve(&request).await
            };
            answer(decision, Utc::now())
        }
        Err(error) => answer(Err(error), Utc::now()),
    }
}

fn request(args: &ReserveArgs) -> Reserve {
    let mut request = Reserve::new(&args.flow);
    if let Some(count) = args.count {
        request = request.count(count);
    }
    if let Some(deadline) = args.deadline {
        request = request.deadline(deadline);
    }
    if let Some(reference) = &args.reference {
        request = request.reference(reference);
    }
    request
}

/// The exit status of a decision: emit (0), or wait the printed seconds (75);
/// an arbiter refusing the request as given is bad usage (64), one that
/// cannot answer is unavailable (69). Errors are printed on stderr here.
fn answer(decision: Result<Decision, Error>, now: DateTime<Utc>) -> Answer {
    match decision {
        Ok(Decision::Deferred {
            retry_at,
            retry_after_seconds,
            ..
        }) => Answer {
            status: EX_TEMPFAIL,
            stdout: Some(seconds_to_wait(retry_at, retry_after_seconds, now).to_string()),
        },
        Ok(_may_emit) => Answer {
            status: 0,
            stdout: None,
        },
        Err(error) => {
            eprintln!("error: {error}");
            let status = match error {
                Error::Refused { status, .. } if (400..500).contains(&status) => EX_USAGE,
                _ => EX_UNAVAILABLE,
            };
            Answer {
                status,
                stdout: None,
            }
        }
    }
}

/// The arbiter's own rounding when it gave it, else `retry_at` by the local
/// clock, rounded up: a shell `sleep` of it never asks too early.
fn seconds_to_wait(
    retry_at: DateTime<Utc>,
    retry_after_seconds: Option<i64>,
    now: DateTime<Utc>,
) -> i64 {
    retry_after_seconds
        .unwrap_or_else(|| {
            let millis = (retry_at - now).num_milliseconds();
            millis.div_euclid(1000) + i64::from(millis.rem_euclid(1000) > 0)
        })
        .max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Failure;

    fn decision(json: &str) -> Result<Decision, Error> {
        Ok(serde_json::from_str(json).unwrap())
    }

    fn now() -> DateTime<Utc> {
        "2026-11-30T14:00:00Z".parse().unwrap()
    }

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

    #[test]
    fn every_outcome_but_a_deferral_says_emit() {
        for outcome in [
            r#"{"outcome":"granted","flow":"invoice"}"#,
            r#"{"outcome":"bypassed","flow":"invoice"}"#,
            r#"{"outcome":"unthrottled","flow":"invoice"}"#,
        ] {
            let emit = Answer {
                status: 0,
                stdout: None,
            };
            assert_eq!(answer(decision(outcome), now()), emit, "{outcome}");
        }
    }

    #[test]
    fn a_deferral_prints_the_seconds_to_wait() {
        let given = decision(
            r#"{"outcome":"deferred","flow":"invoice","retry_at":"2026-11-30T15:00:00Z",
            "retry_after_seconds":3600}"#,
        );
        assert_eq!(
            answer(given, now()),
            Answer {
                status: EX_TEMPFAIL,
                stdout: Some("3600".into())
            }
        );
        // Without the arbiter's seconds: retry_at, rounded up.
        let at = |t: &str| t.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            seconds_to_wait(at("2026-11-30T14:00:01.2Z"), None, now()),
            2
        );
        assert_eq!(seconds_to_wait(at("2026-11-30T14:00:03Z"), None, now()), 3);
        assert_eq!(seconds_to_wait(at("2026-11-30T13:59:00Z"), None, now()), 0);
    }

    #[test]
    fn a_refused_request_is_bad_usage_an_unanswered_one_unavailable() {
        let refused = Error::Refused {
            status: 422,
            problem: Some("invalid-request".into()),
            detail: "`ref` is too long".into(),
        };
        assert_eq!(answer(Err(refused), now()).status, EX_USAGE);
        let unavailable = Error::Unavailable {
            attempts: 7,
            last: Failure::Connect("refused".into()),
        };
        assert_eq!(answer(Err(unavailable), now()).status, EX_UNAVAILABLE);
        let broken = Error::Refused {
            status: 500,
            problem: None,
            detail: "internal".into(),
        };
        assert_eq!(answer(Err(broken), now()).status, EX_UNAVAILABLE);
    }
}
