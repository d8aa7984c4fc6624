//! Telling a store out of reach from a statement that failed: the first is
//! an outage (`store-unavailable`, 503: try again), the second a bug or a
//! state the code does not expect (an opaque 500). Every store error says
//! which it is ([`StoreError`]).

use std::time::Duration;

/// The store could not decide in time; for an enforced flow that is a 503.
#[derive(Clone, Debug, thiserror::Error)]
#[error("quota store unavailable: {0}")]
pub struct StoreUnavailable(pub String);

/// How long a caller should wait before asking again when the store was out
/// of reach: the 503's `Retry-After`, a batch item's `retry_after_seconds`.
pub const RETRY_AFTER_UNAVAILABLE: Duration = Duration::from_secs(2);

/// Why a store call on a decision path gave no answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// Out of reach, or no answer within the time budget: nothing was
    /// granted, try again.
    #[error(transparent)]
    Unavailable(#[from] StoreUnavailable),
    /// The store answered with an error: not an outage, a bug or a state the
    /// code does not expect.
    #[error("store statement failed: {0}")]
    Failed(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if unreachable(&error) {
            StoreError::Unavailable(StoreUnavailable(error.to_string()))
        } else {
            StoreError::Failed(error.to_string())
        }
    }
}

/// Errors that say the store could not be reached or is going away, as
/// opposed to a statement that failed.
pub fn unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 08: connection exception; 57P01-57P03: shutdown, cannot
        // connect now; 53300: too many connections; 25006: a read-only
        // transaction, which is what a standby answers: during a failover a
        // router may send a connection to a node that holds the leader lock
        // but has not left recovery yet (docs/operations/failover.md).
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || ["57P01", "57P02", "57P03", "53300", "25006"].contains(&&*code)
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use sqlx::error::{DatabaseError, ErrorKind};

    use super::unreachable;

    /// A server error with a SQLSTATE, as PostgreSQL sends one.
    #[derive(Debug)]
    struct ServerError(&'static str);

    impl std::fmt::Display for ServerError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for ServerError {}

    impl DatabaseError for ServerError {
        fn message(&self) -> &str {
            self.0
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    fn sqlstate(code: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(ServerError(code)))
    }

    #[test]
    fn lost_connections_and_a_full_pool_are_out_of_reach() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(unreachable(&sqlx::Error::Io(reset)));
        assert!(unreachable(&sqlx::Error::Tls("handshake".into())));
        assert!(unreachable(&sqlx::Error::PoolTimedOut));
        assert!(unreachable(&sqlx::Error::PoolClosed));
        assert!(unreachable(&sqlx::Error::WorkerCrashed));
    }

    #[test]
    fn connection_shutdown_and_standby_sqlstates_are_out_of_reach() {
        for code in [
            "08006", "08001", "57P01", "57P02", "57P03", "53300", "25006",
        ] {
            assert!(unreachable(&sqlstate(code)), "{code}");
        }
    }

    #[test]
    fn a_statement_that_failed_is_not_an_outage() {
        // raise_exception, check_violation, numeric out of range, a query
        // canceled (57014: class 57, but not a shutdown).
        for code in ["P0001", "23514", "22003", "57014", "53200"] {
            assert!(!unreachable(&sqlstate(code)), "{code}");
        }
        assert!(!unreachable(&sqlx::Error::RowNotFound));
        assert!(!unreachable(&sqlx::Error::Protocol("bad".into())));
    }
}
