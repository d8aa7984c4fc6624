//! The HTTP surface (design.md §4): one router per module, merged here.

mod admin;
mod admit;
mod auth;
mod batch;
mod contract;
mod dashboard;
pub mod error;
mod extract;
mod feedback;
mod ops;
mod reserve;
mod route_classes;
mod settle;
mod stream;
mod views;
mod work;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request};
use axum::handler::Handler;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

use crate::administration::Administration;
use crate::admission::AdmissionDesk;
use crate::auth::{Access, AuthMode, KeyRing, Role};
use crate::bypass::BypassDesk;
use crate::catalog::Catalog;
use crate::domain::Secret;
use crate::metrics::Metrics;
use crate::reservations::Reservations;
use crate::work_registry::WorkRegistry;
use error::{ApiError, FailureCause};

/// Request bodies are small JSON documents; anything bigger is refused
/// (batches have a limit of their own).
pub const MAX_BODY_BYTES: usize = 16 * 1024;
pub use batch::MAX_BATCH_BODY_BYTES;

/// What every handler shares. Cheap to clone (one shared allocation): axum
/// clones the state for every request.
#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

pub struct Services {
    pub reservations: Reservations,
    pub admission: AdmissionDesk,
    pub work_registry: WorkRegistry,
    pub administration: Administration,
    pub bypass: BypassDesk,
    pub catalog: Catalog,
    pub metrics: Metrics,
    pub admin_token: Option<Secret>,
    /// `keys`: who may call what is checked (design.md §4).
    pub auth: AuthMode,
    pub keys: KeyRing,
    /// How long a claimed work item is leased before it counts as pending again.
    pub lease_duration: Duration,
    /// Admission: the trusted forwarding header an anonymous caller's address
    /// is read from (`X-Forwarded-For`, `X-Real-IP`); none: the peer's address.
    pub admit_client_ip_header: Option<axum::http::HeaderName>,
    /// `true` once the replica stops: open share streams end, so that a
    /// graceful shutdown does not wait for their clients to hang up.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// What the store can lose in a failover, as last read.
    pub durability: crate::durability::DurabilityWatch,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "quota-arbiter", description = "Share a third-party quota across many workers, with PostgreSQL as the arbiter"),
    modifiers(&AdminToken)
)]
struct ApiDoc;

struct AdminToken;

impl Modify for AdminToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The routes, in groups by the least role their callers need in `keys`
/// mode (design.md §9): each group declares its role once, and both the
/// check (`auth::authorize`, on the group's routes) and the document's
/// `x-required-role` of each operation come from that declaration, so a new
/// route has the role of the group it is put in. (Every store call a
/// handler makes is a product's, within the store timeout: `crate::shell`.)
fn documented_routes(state: Option<&AppState>) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let open = OpenApiRouter::new().merge(ops::router());
    let operator = OpenApiRouter::new()
        .merge(views::router())
        .merge(dashboard::router());
    let worker = OpenApiRouter::new()
        .merge(reserve::router())
        .merge(settle::router())
        .merge(batch::router())
        .merge(feedback::router())
        .merge(work::router())
        .merge(admit::router())
        .merge(stream::router());
    let admin = OpenApiRouter::new()
        .merge(admin::router())
        .merge(route_classes::router());
    let (routes, mut spec) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(group(Access::Open, open, state))
        .merge(group(Access::AtLeast(Role::Operator), operator, state))
        .merge(group(Access::AtLeast(Role::Worker), worker, state))
        .merge(group(Access::AtLeast(Role::Admin), admin, state))
        .split_for_parts();
    contract::complete(&mut spec);
    (routes, spec)
}

/// `routes` as a group that needs `access`: written on each of its
/// operations in the document, and checked on each of its routes.
fn group(
    access: Access,
    mut routes: OpenApiRouter<AppState>,
    state: Option<&AppState>,
) -> OpenApiRouter<AppState> {
    contract::require(routes.get_openapi_mut(), access);
    match state {
        Some(state) => routes.route_layer(middleware::from_fn_with_state(
            (state.clone(), access),
            auth::authorize,
        )),
        None => routes,
    }
}

/// The OpenAPI document, derived from the same routes the server mounts.
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented_routes(None).1
}

pub fn app(state: AppState) -> Router {
    let (routes, spec) = documented_routes(Some(&state));
    let spec = Arc::new(spec);
    // No group names the role of a path no route has, or of a method its
    // path does not have: those are for admins, so that `keys` mode tells no
    // one else which exist.
    let unmatched = || {
        middleware::from_fn_with_state(
            (state.clone(), Access::AtLeast(Role::Admin)),
            auth::authorize,
        )
    };
    routes
        .route(
            "/openapi.json",
            get(move || async move { Json(spec.as_ref().clone()) }),
        )
        .fallback((|| async { ApiError::NotFound("no such resource".into()) }).layer(unmatched()))
        .method_not_allowed_fallback((|| async { ApiError::MethodNotAllowed }).layer(unmatched()))
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(RequestIds::default()))
                .layer(TraceLayer::new_for_http().make_span_with(request_span))
                .layer(PropagateRequestIdLayer::x_request_id())
                .layer(middleware::from_fn(log_failures)),
        )
}

fn request_span(request: &Request) -> tracing::Span {
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id)
}

/// Logs the cause of a 5xx once, inside the request span; the caller only ever
/// sees the opaque problem document.
async fn log_failures(request: Request, next: Next) -> Response {
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let response = next.run(request).await;
    let Some(FailureCause(cause)) = response.extensions().get::<FailureCause>().cloned() else {
        return response;
    };
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        tracing::warn!(cause = %cause, "store unavailable");
        return response;
    }
    tracing::error!(cause = %cause, "request failed");
    let is_problem = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v == error::PROBLEM_JSON);
    if response.status() == StatusCode::INTERNAL_SERVER_ERROR && is_problem {
        // The caller gets the id to quote, never the cause.
        return ApiError::Internal(anyhow::anyhow!("{cause}")).render(request_id);
    }
    response
}

/// Request ids unique across replicas: process start time and a counter.
#[derive(Clone)]
struct RequestIds {
    prefix: String,
    next: Arc<AtomicU64>,
}

impl Default for RequestIds {
    fn default() -> Self {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            prefix: format!("{:x}{:x}", started.as_micros(), std::process::id()),
            next: Arc::default(),
        }
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::from_str(&format!("{}-{n:x}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
}
