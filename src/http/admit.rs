//! `GET /v1/admit` (headers only: an nginx `auth_request` or forward-auth
//! target) and `POST /v1/admit` (JSON): may a gateway let one request of its
//! caller through? Design.md §11. Every answer that reached a route class
//! carries the caller's own bucket in the RateLimit fields, and nothing of
//! any other caller or tenant.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::{request::Parts, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::ApiError;
use super::extract::ApiJson;
use super::AppState;
use crate::domain::admission::{self, Caller, Outcome, RouteClass, Verdict};
use crate::domain::ratelimit_fields;
use crate::metrics::UNKNOWN_ROUTE_CLASS;
use crate::store::StoreError;

pub(crate) const PRINCIPAL_HEADER: &str = "x-quota-principal";
pub(crate) const TENANT_HEADER: &str = "x-quota-tenant";
pub(crate) const ROUTE_CLASS_HEADER: &str = "x-quota-route-class";

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(admit_by_headers, admit_by_body))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdmitBody {
    /// The caller the gateway authenticated; with `tenant`, or neither for an
    /// anonymous caller (counted by its network range).
    #[schema(schema_with = crate::domain::input::schema::optional_identifier)]
    pub(crate) principal: Option<String>,
    /// The principal's tenant; with `principal`, or neither.
    #[schema(schema_with = crate::domain::input::schema::optional_identifier)]
    pub(crate) tenant: Option<String>,
    /// The route class whose profile applies.
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub(crate) route_class: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Admitted {
    /// Always true: every refusal is a problem document.
    pub(crate) admitted: bool,
}

/// The peer's address, when the server was started with it (a real
/// listener); the anonymous class falls back on it without a trusted header.
pub(crate) struct Peer(Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>();
        Ok(Peer(peer.map(|ConnectInfo(address)| address.ip())))
    }
}

/// Admit one request, identity in headers: 204 admitted; 429 the caller's
/// own limit; 503 the provider's capacity, or the store out of reach (fail
/// closed). Fit for nginx `auth_request` and forward-auth.
#[utoipa::path(
    get, path = "/v1/admit", tag = "admit",
    params(
        ("X-Quota-Route-Class" = String, Header, description = "The route class whose profile applies"),
        ("X-Quota-Principal" = Option<String>, Header,
         description = "The authenticated caller; with X-Quota-Tenant, or neither for an anonymous caller"),
        ("X-Quota-Tenant" = Option<String>, Header, description = "The principal's tenant"),
    ),
    // 404, 429, 503 and the RateLimit fields: `contract::document_admission`.
    responses((status = 204, description = "Admitted"))
)]
pub(crate) async fn admit_by_headers(
    State(state): State<AppState>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    let asked = (|| {
        Ok::<_, ApiError>((
            single_header(&headers, PRINCIPAL_HEADER)?,
            single_header(&headers, TENANT_HEADER)?,
            single_header(&headers, ROUTE_CLASS_HEADER)?.ok_or_else(|| {
                ApiError::Invalid("the X-Quota-Route-Class header is required".into())
            })?,
        ))
    })();
    let (principal, tenant, route_class) = match asked {
        Ok(asked) => asked,
        Err(error) => return error.into_response(),
    };
    let address = client_address(&state, &headers, peer);
    let answered = admit(&state, &route_class, principal, tenant, address).await;
    answer(answered, StatusCode::NO_CONTENT.into_response())
}

/// Admit one request, identity in the body: 200 `{"admitted": true}`, or the
/// problems of `GET /v1/admit`.
#[utoipa::path(
    post, path = "/v1/admit", tag = "admit",
    request_body = AdmitBody,
    // 404, 429, 503 and the RateLimit fields: `contract::document_admission`.
    responses((status = 200, description = "Admitted", body = Admitted))
)]
pub(crate) async fn admit_by_body(
    State(state): State<AppState>,
    Peer(peer): Peer,
    headers: HeaderMap,
    ApiJson(body): ApiJson<AdmitBody>,
) -> Response {
    let address = client_address(&state, &headers, peer);
    let answered = admit(
        &state,
        &body.route_class,
        body.principal,
        body.tenant,
        address,
    )
    .await;
    let admitted = Json(Admitted { admitted: true }).into_response();
    answer(answered, admitted)
}

/// A header the gateway sets once; given twice it is refused rather than
/// guessed at (a gateway that appends instead of replacing would let the
/// caller's own value through).
fn single_header(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::Invalid(format!(
            "the {name} header is given more than once"
        )));
    }
    value
        .to_str()
        .map(|v| Some(v.to_string()))
        .map_err(|_| ApiError::Invalid(format!("the {name} header must be printable ASCII")))
}

/// The caller's address: from the configured trusted forwarding header, or
/// the peer's without one. A configured header missing or unreadable gives
/// none (an anonymous caller is then refused with a 422: lumping every such
/// caller into the proxy's own network would let one starve the others).
fn client_address(state: &AppState, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
    match &state.admit_client_ip_header {
        Some(header) => headers
            .get_all(header)
            .iter()
            .next_back()
            .and_then(|value| value.to_str().ok())
            .and_then(admission::forwarded_address),
        None => peer,
    }
}

/// An answer about a route class: the class, and the verdict or why there is none.
type Answered = Result<(RouteClass, Verdict), (Option<RouteClass>, ApiError)>;

async fn admit(
    state: &AppState,
    route_class: &str,
    principal: Option<String>,
    tenant: Option<String>,
    address: Option<IpAddr>,
) -> Answered {
    crate::domain::input::name(route_class)
        .map_err(|why| (None, ApiError::Invalid(format!("the route class {why}"))))?;
    // Before the first catalog load no class is known: fail closed.
    let snapshot = match state.catalog.loaded() {
        Ok(snapshot) => snapshot,
        Err(not_loaded) => {
            state
                .metrics
                .record_admit(UNKNOWN_ROUTE_CLASS, Outcome::StoreUnavailable);
            return Err((None, not_loaded.into()));
        }
    };
    let Some(class) = snapshot.route_class(route_class).cloned() else {
        return Err((
            None,
            ApiError::NotFound(format!("no route class `{route_class}`")),
        ));
    };
    let caller = match Caller::identify(principal.as_deref(), tenant.as_deref(), address) {
        Ok(caller) => caller,
        Err(why) => return Err((Some(class), ApiError::Invalid(why))),
    };
    match state.admission.admit(&class, &caller).await {
        Ok(verdict) => {
            state.metrics.record_admit(&class.name, verdict.outcome);
            Ok((class, verdict))
        }
        Err(error) => {
            if matches!(error, StoreError::Unavailable(_)) {
                state
                    .metrics
                    .record_admit(&class.name, Outcome::StoreUnavailable);
            }
            Err((Some(class), error.into()))
        }
    }
}

/// The response: `admitted` when admitted, else the problem; the RateLimit
/// fields of the caller's own bucket whenever the class is known (the policy
/// alone when the store gave no bucket).
fn answer(answered: Answered, admitted: Response) -> Response {
    let (class, verdict, mut response) = match answered {
        Ok((class, verdict)) => {
            let response = match verdict.outcome {
                Outcome::Admitted => admitted,
                Outcome::CallerRateLimited => ApiError::CallerRateLimited(format!(
                    "this caller's rate limit for route class `{}` is spent; retry after the Retry-After seconds",
                    class.name
                ))
                .into_response(),
                // (A verdict drawn from the store's answer is never `StoreUnavailable`.)
                Outcome::CapacityExhausted | Outcome::StoreUnavailable => {
                    ApiError::CapacityExhausted(format!(
                        "route class `{}` has no capacity left for this caller's tenant in this window; \
                         this is the provider's limit, not the caller's",
                        class.name
                    ))
                    .into_response()
                }
            };
            (Some(class), Some(verdict), response)
        }
        Err((class, error)) => (class, None, error.into_response()),
    };
    let headers = response.headers_mut();
    if let Some(class) = &class {
        ratelimit_fields::insert(
            headers,
            ratelimit_fields::POLICY,
            admission::policy_field(class),
        );
        if let Some(verdict) = &verdict {
            ratelimit_fields::insert(
                headers,
                ratelimit_fields::LIMIT,
                admission::limit_field(class, verdict.limit),
            );
        }
    }
    if let Some(verdict) = &verdict {
        match verdict.retry_after {
            Some(seconds) => {
                headers.insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            None => {
                headers.remove(axum::http::header::RETRY_AFTER);
            }
        }
    }
    response
}
