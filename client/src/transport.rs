//! The I/O shell every call goes through: the process's cooldown gate and
//! pacing, one POST, and retries of transient failures by [`RetryPolicy`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::RETRY_AFTER;
use reqwest::{Response, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Failure};
use crate::gate::{Gates, Pacer};
use crate::retry::{parse_retry_after, RetryPolicy};

pub struct Transport {
    pub http: reqwest::Client,
    /// Ends with `/`, so API paths join below any prefix it has.
    pub base: Url,
    pub key: Option<String>,
    pub retry: RetryPolicy,
    pub gates: Arc<Gates>,
    pub pacer: Option<Arc<Pacer>>,
}

/// How one attempt ended.
enum Attempt<T> {
    /// An answer, or a refusal that asking again would not change.
    Final(Result<T, Error>),
    /// Worth another attempt, after at least the `Retry-After`, if given.
    Transient(Failure, Option<Duration>),
}

/// The problem+json fields the client reads.
#[derive(Deserialize)]
struct Problem {
    #[serde(rename = "type")]
    kind: Option<String>,
    detail: Option<String>,
}

impl Transport {
    /// POSTs `body` to `path` (relative, like `v1/reserve`) and reads a `T`,
    /// retrying transient failures. Dropping the future abandons the call:
    /// nothing is left running.
    pub async fn post<B, T>(&self, path: &str, body: &B) -> Result<T, Error>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        self.post_attempts(path, body, self.retry.attempts).await
    }

    /// [`Transport::post`] with at most `attempts` attempts (a probe of an
    /// arbiter taken for unreachable asks once).
    pub async fn post_attempts<B, T>(&self, path: &str, body: &B, attempts: u32) -> Result<T, Error>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let url = self
            .base
            .join(path)
            .map_err(|why| Error::Setup(format!("{path}: {why}")))?;
        let mut attempt = 1;
        loop {
            self.gates.cooldown().pass().await;
            if let Some(pacer) = &self.pacer {
                pacer.take().await;
            }
            let (failure, retry_after) = match self.attempt(&url, body).await {
                Attempt::Final(result) => return result,
                Attempt::Transient(failure, retry_after) => (failure, retry_after),
            };
            if let Some(wait) = retry_after {
                // Every other call of the process waits this out too.
                self.gates.cooldown().close_for(wait);
            }
            if attempt >= attempts {
                tracing::warn!(%url, attempts = attempt, %failure, "quota arbiter unavailable");
                return Err(Error::Unavailable {
                    attempts: attempt,
                    last: failure,
                });
            }
            let wait = self.retry.wait_before_retry(attempt, retry_after);
            tracing::warn!(%url, attempt, %failure, wait_ms = wait.as_millis() as u64,
                "quota arbiter call failed; retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    async fn attempt<B, T>(&self, url: &Url, body: &B) -> Attempt<T>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let mut request = self.http.post(url.clone()).json(body);
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        match request.send().await {
            Ok(response) => read(response).await,
            Err(error) => match failure_of(&error) {
                Some(failure) => Attempt::Transient(failure, None),
                None => Attempt::Final(Err(Error::Setup(error.to_string()))),
            },
        }
    }
}

/// The statuses that say "not now" rather than "not this": too many requests,
/// and a gateway or the arbiter unable to answer for the moment.
fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// A transport error worth retrying, if it is one.
fn failure_of(error: &reqwest::Error) -> Option<Failure> {
    if error.is_timeout() {
        Some(Failure::Timeout)
    } else if error.is_connect() {
        Some(Failure::Connect(source_chain(error)))
    } else if error.is_request() || error.is_body() {
        Some(Failure::Transport(source_chain(error)))
    } else {
        None
    }
}

/// reqwest's own message is only "error sending request"; the cause is below.
fn source_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

async fn read<T: DeserializeOwned>(response: Response) -> Attempt<T> {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| parse_retry_after(value, SystemTime::now()));
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(error) => {
            let failure = failure_of(&error).unwrap_or(Failure::Transport(source_chain(&error)));
            return Attempt::Transient(failure, None);
        }
    };
    if status.is_success() {
        let parsed = serde_json::from_slice(&body).map_err(|why| {
            Error::Protocol(format!(
                "HTTP {status} with a body that does not read as expected: {why}"
            ))
        });
        return Attempt::Final(parsed);
    }
    let problem: Option<Problem> = serde_json::from_slice(&body).ok();
    let slug = problem
        .as_ref()
        .and_then(|p| p.kind.as_deref())
        .map(|kind| kind.rsplit('/').next().unwrap_or(kind).to_string());
    if is_transient(status) {
        let failure = Failure::Status {
            status: status.as_u16(),
            problem: slug,
        };
        return Attempt::Transient(failure, retry_after);
    }
    let detail = problem
        .and_then(|p| p.detail)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned());
    Attempt::Final(Err(Error::Refused {
        status: status.as_u16(),
        problem: slug,
        detail,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_not_now_statuses_are_transient() {
        let transient: Vec<u16> = (100..600)
            .filter(|&s| is_transient(StatusCode::from_u16(s).unwrap()))
            .collect();
        assert_eq!(transient, [429, 502, 503, 504]);
    }
}
