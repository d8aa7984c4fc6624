//! The one error type of the HTTP layer, rendered as `application/problem+json`
//! (RFC 9457) with a stable `type` per class and no internal detail.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::CatalogError;
use crate::store::{StoreError, StoreUnavailable, RETRY_AFTER_UNAVAILABLE};

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";
const PROBLEM_BASE: &str = "https://quota-arbiter.dev/problems/";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// The body is not JSON (or not readable).
    #[error("{0}")]
    MalformedJson(String),
    /// A path parameter does not parse.
    #[error("{0}")]
    BadPath(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("request body too large")]
    PayloadTooLarge,
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("the admin API is disabled: set QUOTA_ADMIN_TOKEN to enable it")]
    AdminDisabled,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// Admission: the caller's own bucket is empty (its limit, not the
    /// provider's); the admit handler adds `Retry-After` and the RateLimit fields.
    #[error("{0}")]
    CallerRateLimited(String),
    /// Admission: the tenant's share or the route class's shared capacity is
    /// taken for this window (the provider's limit, not the caller's).
    #[error("{0}")]
    CapacityExhausted(String),
    #[error(transparent)]
    StoreUnavailable(#[from] StoreUnavailable),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// The problem document; `type` is stable per error class.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// A 500 only: the request id its cause is logged under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// The cause of a 500 or 503, handed to the logging middleware so it is logged
/// once, inside the request span, and never sent to the caller.
#[derive(Clone, Debug)]
pub(crate) struct FailureCause(pub Arc<str>);

impl ApiError {
    fn class(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::MalformedJson(_) => {
                (StatusCode::BAD_REQUEST, "malformed-json", "Malformed JSON")
            }
            ApiError::BadPath(_) => (StatusCode::BAD_REQUEST, "bad-path", "Malformed path"),
            ApiError::Invalid(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-request",
                "Invalid request",
            ),
            ApiError::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Expected application/json",
            ),
            ApiError::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
            ),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::AdminDisabled => (StatusCode::FORBIDDEN, "forbidden", "Admin API disabled"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ApiError::CallerRateLimited(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "caller-rate-limited",
                "Caller rate limited",
            ),
            ApiError::CapacityExhausted(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "capacity-exhausted",
                "Capacity exhausted",
            ),
            ApiError::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Quota store unavailable",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.render(None)
    }
}

impl ApiError {
    /// The problem document; a 500's names the request id its cause is
    /// logged under (the logging middleware knows it, the handler does not).
    pub(super) fn render(self, request_id: Option<String>) -> Response {
        let (status, slug, title) = self.class();
        let (detail, cause) = match &self {
            ApiError::StoreUnavailable(cause) => (
                "the quota store did not answer in time; nothing was granted, try again"
                    .to_string(),
                Some(cause.to_string()),
            ),
            ApiError::Internal(cause) => ("internal error".to_string(), Some(format!("{cause:#}"))),
            other => (other.to_string(), None),
        };
        let problem = Problem {
            kind: format!("{PROBLEM_BASE}{slug}"),
            title: title.to_string(),
            status: status.as_u16(),
            detail,
            request_id: request_id.filter(|_| status == StatusCode::INTERNAL_SERVER_ERROR),
        };
        let mut response = (status, axum::Json(problem)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        match self {
            ApiError::StoreUnavailable(_) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(RETRY_AFTER_UNAVAILABLE.as_secs()),
                );
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        if let Some(cause) = cause {
            response.extensions_mut().insert(FailureCause(cause.into()));
        }
        response
    }
}

impl From<sqlx::Error> for ApiError {
    /// A store that cannot be reached is an outage (503), not a bug (500).
    fn from(error: sqlx::Error) -> Self {
        StoreError::from(error).into()
    }
}

impl From<StoreError> for ApiError {
    /// A store out of reach is a 503; a statement that failed is an opaque
    /// 500, its cause logged once by the middleware.
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(unavailable) => ApiError::StoreUnavailable(unavailable),
            StoreError::Failed(why) => ApiError::Internal(anyhow::anyhow!(why)),
        }
    }
}

impl From<CatalogError> for ApiError {
    fn from(error: CatalogError) -> Self {
        match error {
            CatalogError::Invalid(why) => ApiError::Invalid(why),
            CatalogError::NotFound(why) => ApiError::NotFound(why),
            CatalogError::Conflict(why) => ApiError::Conflict(why),
            CatalogError::Store(error) => error.into(),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::JsonDataError(e) => ApiError::Invalid(e.body_text()),
            JsonRejection::JsonSyntaxError(e)
                if crate::domain::input::is_lone_surrogate(&e.body_text()) =>
            {
                ApiError::Invalid(format!(
                    "a string holds half of a UTF-16 surrogate pair, which names no character: {}",
                    e.body_text()
                ))
            }
            // A syntax error. `ApiJson` checks the content type and reads the
            // body (a 413 past the limit) before axum's parser sees it, so
            // the parser's is the only other rejection that reaches here.
            other => ApiError::MalformedJson(other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::Invalid(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadPath(rejection.body_text())
    }
}
