//! `quota-arbiter reserve`: a shell worker's "may I emit now?" through the
//! worker client, answered by the exit status (sysexits.h codes).

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use quota_arbiter_client::{Client, Decision, Error, Reserve, Settings};

use crate::cli::{ReserveArgs, EX_USAGE};

/// The arbiter could not be asked: unreachable or failing after the retries.
pub const EX_UNAVAILABLE: u8 = 69;
/// Deferred: ask again after the seconds printed on stdout.
pub const EX_TEMPFAIL: u8 = 75;

/// What the command says: its exit status and its standard output.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u8,
    pub stdout: Option<String>,
}

pub async fn reserve(args: &ReserveArgs) -> ExitCode {
    // One call and gone: no share stream (it would count this process as a
    // live client of the quota for a moment), so no local fallback either.
    let client = Client::builder()
        .settings(Settings::from_env())
        .share_stream(false)
        .build();
    let answer = match client {
        Ok(client) => {
            let request = request(args);
            let decision = if args.wait {
                client.acquire(&request).await
            } else {
                client.reserve(&request).await
            };
            answer(decision, Utc::now())
        }
        Err(error) => answer(Err(error), Utc::now()),
    };
    if let Some(line) = &answer.stdout {
        println!("{line}");
    }
    ExitCode::from(answer.status)
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
pub fn answer(decision: Result<Decision, Error>, now: DateTime<Utc>) -> Answer {
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
    use quota_arbiter_client::Failure;

    fn decision(json: &str) -> Result<Decision, Error> {
        Ok(serde_json::from_str(json).unwrap())
    }

    fn now() -> DateTime<Utc> {
        "2026-11-30T14:00:00Z".parse().unwrap()
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
