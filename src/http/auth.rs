//! The one middleware applying a group's role (`crate::auth`) in `keys`
//! mode, and what handlers need of the caller: who took a lease, who may
//! free it.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, request::Parts};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;
use crate::auth::{self, Access, AuthMode, Denied, Principal};

/// In `keys` mode, refuses a call whose key is missing or unknown (401) or
/// whose role is below `access`, the one its route's group declares (403),
/// and hands the caller on to the handlers. In `open` mode every caller is
/// trusted, as before keys existed.
pub(crate) async fn authorize(
    State((state, access)): State<(AppState, Access)>,
    mut request: Request,
    next: Next,
) -> Response {
    if state.auth == AuthMode::Open {
        return next.run(request).await;
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let caller = state.keys.caller(authorization, state.admin_token.as_ref());
    match auth::authorize(access, caller.as_ref()) {
        Ok(()) => {
            if let Some(caller) = caller {
                request.extensions_mut().insert(caller);
            }
            next.run(request).await
        }
        Err(Denied::Unauthenticated) => ApiError::Unauthorized.into_response(),
        Err(Denied::Forbidden { needed }) => ApiError::Forbidden(format!(
            "this key's role may not call this; it needs the {needed} role or above"
        ))
        .into_response(),
    }
}

/// The caller the middleware let through; `None` in `open` mode (and on the
/// open routes).
pub(crate) struct Caller(pub Option<Principal>);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Caller(parts.extensions.get::<Principal>().cloned()))
    }
}

impl Caller {
    /// Records that this caller's key took `leases`, so that only it (or an
    /// admin) frees them. Not recorded, a lease is an admin's to free and
    /// otherwise expires by itself: the grant still stands.
    pub(crate) async fn took(&self, state: &AppState, leases: impl IntoIterator<Item = i64>) {
        let Some(key_id) = self.0.as_ref().and_then(|caller| caller.key_id) else {
            return;
        };
        let leases: Vec<i64> = leases.into_iter().collect();
        if leases.is_empty() {
            return;
        }
        let recorded = state.reservations.hold_leases(&leases, key_id).await;
        if recorded.is_err() {
            tracing::warn!(key_id, "the key that took a lease is not recorded; only an admin can free it before it expires");
        }
    }

    /// In `keys` mode only the key that took lease `lease_id`, or an admin,
    /// frees it; in `open` mode there are no keys and anyone may.
    pub(crate) async fn may_release(
        &self,
        state: &AppState,
        lease_id: i64,
    ) -> Result<(), ApiError> {
        let Some(caller) = &self.0 else {
            return Ok(());
        };
        let holder = match caller.role {
            auth::Role::Admin => None,
            _ => state.reservations.lease_holder(lease_id).await?,
        };
        if auth::may_release(caller, holder) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "lease {lease_id} was not taken by this key; it stays held"
            )))
        }
    }
}
