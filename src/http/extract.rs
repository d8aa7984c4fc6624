//! Extractors whose rejections use our problem+json format, and the admin guard.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

/// `axum::Json`, but a bad body becomes an [`ApiError`], and every body is
/// a JSON object: serde would take a struct written as an array (`[1, 2]`).
pub(crate) struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !json_content_type(req.headers()) {
            return Err(ApiError::UnsupportedMediaType(
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        let body = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge
            } else {
                ApiError::MalformedJson(rejection.body_text())
            }
        })?;
        let opens_an_object = body
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{');
        if !opens_an_object && serde_json::from_slice::<IgnoredAny>(&body).is_ok() {
            return Err(ApiError::Invalid("the body must be a JSON object".into()));
        }
        let axum::Json(value) = axum::Json::<T>::from_bytes(&body)?;
        Ok(ApiJson(value))
    }
}

/// `application/json`, or a `+json` type such as `application/merge-patch+json`.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// `axum::extract::Path`, with problem+json rejections.
pub(crate) struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(ApiPath(value))
    }
}

/// `axum::extract::Query`, with problem+json rejections.
pub(crate) struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

/// Proof that the caller presented the admin bearer token, or in `keys` mode
/// a key whose role the route admits.
pub(crate) struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // `keys` mode: the middleware has already held the key to the route's role.
        if parts.extensions.get::<crate::auth::Principal>().is_some() {
            return Ok(Admin);
        }
        let expected = state.admin_token.as_ref().ok_or(ApiError::AdminDisabled)?;
        let presented = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or(ApiError::Unauthorized)?;
        // Constant-time, so the comparison does not leak how much matched.
        if bool::from(presented.as_bytes().ct_eq(expected.expose().as_bytes())) {
            Ok(Admin)
        } else {
            Err(ApiError::Unauthorized)
        }
    }
}

/// An optional RFC 3339 timestamp field that names its expected form when it
/// is wrong (serde's own message for a zoneless one is "premature end of input").
pub(crate) fn optional_timestamp<'de, D>(d: D) -> Result<Option<DateTime<Utc>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    DateTime::parse_from_rfc3339(&text)
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|why| {
            serde::de::Error::custom(format!(
                "`{text}` is not an RFC 3339 timestamp with a zone, like 2026-11-30T14:30:00Z ({why})"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_content_type(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
        headers
    }

    #[test]
    fn json_and_json_suffixed_application_types_are_json() {
        for json in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/merge-patch+json",
            " application/problem+json ;q=1",
        ] {
            assert!(json_content_type(&with_content_type(json)), "{json}");
        }
        for other in ["text/plain", "application/xml", "text/x+json", "", "json"] {
            assert!(!json_content_type(&with_content_type(other)), "{other}");
        }
        assert!(!json_content_type(&HeaderMap::new()), "no content type");
    }
}
