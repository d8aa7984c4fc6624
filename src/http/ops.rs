//! Liveness and readiness: open to every caller, for probes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    pub(crate) status: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Readiness {
    pub(crate) ready: bool,
    /// The store answers and every migration of this build is applied.
    pub(crate) store: bool,
    /// Quotas and flows have been loaded at least once.
    pub(crate) catalog: bool,
    /// The catalog and the key ring were reloaded within their bound
    /// (`catalog_stale_after`): a replica that cannot reload them may be
    /// obeying flags or keys changed since.
    pub(crate) fresh: bool,
    /// What a failover of the store can lose: `synchronous` (commits wait
    /// for a standby: nothing answered), `asynchronous` (the last commits),
    /// `unknown` (not read yet). Informative: it does not make a replica unready.
    pub(crate) durability: crate::durability::Durability,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store is reachable with migrations applied, and the catalog and the key
/// ring are loaded and recent.
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses((status = 200, body = Readiness), (status = 503, body = Readiness)))]
pub(crate) async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let (store, catalog) = state.administration.readiness().await;
    let fresh = !state.catalog.is_stale() && state.catalog.within_bound(state.keys.age());
    let ready = store && catalog && fresh;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness {
            ready,
            store,
            catalog,
            fresh,
            durability: state.durability.durability(),
        }),
    )
}
