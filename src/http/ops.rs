//! Operations endpoints: liveness, readiness, metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use crate::metrics::{self, WindowUsage};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    /// The store answers and every migration of this build is applied.
    pub store: bool,
    /// Quotas and flows have been loaded at least once.
    pub catalog: bool,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store is reachable with migrations applied, and the catalog is loaded.
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses((status = 200, body = Readiness), (status = 503, body = Readiness)))]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let store = tokio::time::timeout(state.store_timeout, state.store.is_ready())
        .await
        .unwrap_or(false);
    let catalog = state.catalog.is_loaded();
    let ready = store && catalog;
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
        }),
    )
}

/// Prometheus text exposition (format 0.0.4).
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let snapshot = state.catalog.snapshot();
    let flows: Vec<_> = snapshot
        .as_ref()
        .map(|s| s.flows().cloned().collect())
        .unwrap_or_default();
    if let Some(snapshot) = &snapshot {
        let classes = snapshot.route_classes().map(|c| c.name.as_str());
        state.metrics.register_route_classes(classes);
    }
    let usage = tokio::time::timeout(state.store_timeout, state.store.current_usage())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|rows| {
            rows.into_iter()
                .map(|row| WindowUsage {
                    quota: row.quota,
                    count: row.count,
                    hourly_ceiling: row.hourly_ceiling,
                    effective_rate: row.effective_rate,
                    effective_burst: row.effective_burst,
                })
                .collect::<Vec<_>>()
        });
    state
        .metrics
        .set_state(&flows, usage.as_deref(), state.store.pool());
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}
