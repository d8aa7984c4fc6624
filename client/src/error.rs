//! What can go wrong talking to the arbiter. A deferral is not here: it is a
//! decision ([`crate::Decision::Deferred`]).

use std::fmt;

/// One failed attempt that is worth retrying.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// No connection to the arbiter (refused, unreachable, DNS).
    Connect(String),
    /// The arbiter did not answer within the client's timeout.
    Timeout,
    /// The connection broke while the request was under way.
    Transport(String),
    /// 429, 502, 503 or 504; `problem` is the problem+json `type` slug, when
    /// the arbiter sent one (`store-unavailable`).
    Status {
        status: u16,
        problem: Option<String>,
    },
}

#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Every attempt failed transiently; `last` is the last failure.
    Unavailable { attempts: u32, last: Failure },
    /// The arbiter refused the request (a 4xx other than 429, or a 500):
    /// asking again the same way would not help.
    Refused {
        status: u16,
        problem: Option<String>,
        detail: String,
    },
    /// A 2xx whose body is not what the API promises.
    Protocol(String),
    /// The HTTP client could not be set up.
    Setup(String),
}

impl Error {
    /// The arbiter could not be reached or could not reach its store: a
    /// connection error, a timeout, or 503 `store-unavailable`, after the
    /// retries. This is when a flow that opted in is decided by the local
    /// fallback (design.md §12) instead of failing with this error.
    pub fn arbiter_unreachable(&self) -> bool {
        match self {
            Error::Unavailable { last, .. } => match last {
                Failure::Connect(_) | Failure::Timeout => true,
                Failure::Status { status, problem } => {
                    *status == 503 && problem.as_deref() == Some("store-unavailable")
                }
                // An answer cut short: the arbiter was there.
                Failure::Transport(_) => false,
            },
            _ => false,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Connect(why) => write!(f, "cannot connect: {why}"),
            Failure::Timeout => f.write_str("no answer within the timeout"),
            Failure::Transport(why) => write!(f, "connection broken: {why}"),
            Failure::Status {
                status,
                problem: Some(problem),
            } => write!(f, "HTTP {status} {problem}"),
            Failure::Status {
                status,
                problem: None,
            } => write!(f, "HTTP {status}"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unavailable { attempts, last } => {
                write!(
                    f,
                    "quota arbiter unavailable after {attempts} attempts: {last}"
                )
            }
            Error::Refused {
                status,
                problem,
                detail,
            } => {
                let problem = problem.as_deref().unwrap_or("error");
                write!(
                    f,
                    "quota arbiter refused the request: HTTP {status} {problem}: {detail}"
                )
            }
            Error::Protocol(why) => write!(f, "unexpected answer from the quota arbiter: {why}"),
            Error::Setup(why) => write!(f, "quota arbiter client setup: {why}"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(last: Failure) -> Error {
        Error::Unavailable { attempts: 7, last }
    }

    #[test]
    fn unreachable_means_no_connection_or_no_store_after_the_retries() {
        assert!(unavailable(Failure::Connect("refused".into())).arbiter_unreachable());
        let no_store = Failure::Status {
            status: 503,
            problem: Some("store-unavailable".into()),
        };
        assert!(unavailable(no_store).arbiter_unreachable());
        assert!(unavailable(Failure::Timeout).arbiter_unreachable());
        for reachable in [
            Failure::Transport("reset".into()),
            Failure::Status {
                status: 503,
                problem: None,
            },
            Failure::Status {
                status: 429,
                problem: None,
            },
        ] {
            assert!(!unavailable(reachable).arbiter_unreachable());
        }
        let refused = Error::Refused {
            status: 422,
            problem: Some("invalid-request".into()),
            detail: "`count` must be between 1 and 10000".into(),
        };
        assert!(!refused.arbiter_unreachable());
    }

    #[test]
    fn unavailable_says_so() {
        let error = unavailable(Failure::Status {
            status: 503,
            problem: Some("store-unavailable".into()),
        });
        assert_eq!(
            error.to_string(),
            "quota arbiter unavailable after 7 attempts: HTTP 503 store-unavailable"
        );
    }
}
