//! Extractors whose rejections use our problem+json format, and the admin guard.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

/// `axum::Json`, but a bad body becomes an [`ApiError`].
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    axum::Json<T>: FromRequest<S, Rejection = axum::extract::rejection::JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = axum::Json::<T>::from_request(req, state).await?;
        Ok(ApiJson(value))
    }
}

/// `axum::extract::Query`, with problem+json rejections.
pub struct ApiQuery<T>(pub T);

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
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // `keys` mode: the middleware has already held the key to the role table.
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
pub fn optional_timestamp<'de, D>(d: D) -> Result<Option<DateTime<Utc>>, D::Error>
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
