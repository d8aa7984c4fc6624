//! Admin API: the catalog's quotas and flows, behind the admin bearer token
//! (an admin key in `keys` mode).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::extract::{Admin, ApiJson, ApiPath};
use super::AppState;
use crate::domain::catalog::{validate_name, FlowBody, FlowPatch, Patch, QuotaLimits, QuotaPatch};
use crate::store::{FlowRow, QuotaRow, WhenMissing};

/// Who the audit trail names for changes made with the admin token.
pub(super) const ADMIN_ACTOR: &str = "api:admin";

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_quotas))
        .routes(routes!(get_quota, put_quota, patch_quota, delete_quota))
        .routes(routes!(list_flows))
        .routes(routes!(get_flow, put_flow, patch_flow, delete_flow))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QuotaList {
    pub(crate) quotas: Vec<QuotaRow>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FlowList {
    pub(crate) flows: Vec<FlowRow>,
}

pub(super) fn valid_name(name: &str, what: &str) -> Result<(), ApiError> {
    validate_name(name).map_err(|why| ApiError::Invalid(format!("{what} {why}")))
}

/// Every replica reloads on the catalog trigger's NOTIFY; this one reloads at
/// once so its own next answer already obeys the change.
pub(super) async fn changed<T>(state: &AppState, answer: T) -> Result<T, ApiError> {
    state.catalog.refresh(&state.store).await?;
    Ok(answer)
}

/// One quota.
#[utoipa::path(get, path = "/v1/quotas/{name}", tag = "admin",
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 200, body = QuotaRow), (status = 401, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn get_quota(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<QuotaRow>, ApiError> {
    valid_name(&name, "quota name")?;
    let row = state.store.quota(&name).await?;
    row.map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no quota `{name}`")))
}

/// Create a quota or replace all its settings: a limit left out is off, a
/// ceiling left out is QUOTA_HOURLY_CEILING. To change one field, PATCH.
#[utoipa::path(put, path = "/v1/quotas/{name}", tag = "admin", request_body = QuotaLimits,
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 200, body = QuotaRow), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub(crate) async fn put_quota(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<QuotaLimits>,
) -> Result<Json<QuotaRow>, ApiError> {
    valid_name(&name, "quota name")?;
    let settings = body
        .settings(state.default_ceiling)
        .map_err(ApiError::Invalid)?;
    let row = state.store.put_quota(ADMIN_ACTOR, &name, &settings).await?;
    changed(&state, Json(row)).await
}

/// Change only the fields given (JSON merge patch): `null` turns a limit off.
/// A quota that does not exist is a 404: `PUT` creates.
#[utoipa::path(patch, path = "/v1/quotas/{name}", tag = "admin", request_body(content = QuotaPatch,
        content_type = "application/merge-patch+json"),
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 200, body = QuotaRow), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub(crate) async fn patch_quota(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(patch): ApiJson<QuotaPatch>,
) -> Result<Json<QuotaRow>, ApiError> {
    valid_name(&name, "quota name")?;
    let row = state
        .store
        .patch_quota(
            ADMIN_ACTOR,
            &name,
            patch,
            WhenMissing::NotFound,
            state.default_ceiling,
        )
        .await?;
    changed(&state, Json(row)).await
}

/// Delete a quota and its windows; 409 while a flow still spends it.
#[utoipa::path(delete, path = "/v1/quotas/{name}", tag = "admin",
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub(crate) async fn delete_quota(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    valid_name(&name, "quota name")?;
    state.store.delete_quota(ADMIN_ACTOR, &name).await?;
    changed(&state, StatusCode::NO_CONTENT).await
}

/// List quotas.
#[utoipa::path(get, path = "/v1/quotas", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = QuotaList), (status = 401, body = Problem)))]
pub(crate) async fn list_quotas(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<QuotaList>, ApiError> {
    Ok(Json(QuotaList {
        quotas: state.store.list_quotas().await?,
    }))
}

/// One flow.
#[utoipa::path(get, path = "/v1/flows/{name}", tag = "admin",
    params(("name" = String, Path, description = "Flow name")),
    security(("admin_token" = [])),
    responses((status = 200, body = FlowRow), (status = 401, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn get_flow(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<FlowRow>, ApiError> {
    valid_name(&name, "flow name")?;
    let row = state.store.flow(&name).await?;
    row.map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no flow `{name}`")))
}

/// Create a flow or replace all its settings: no `mode` is `observe`, no
/// `priority` is 2, no `enforce_percent` is all. The quota must exist unless
/// `create_quota` is true. To change one field, PATCH.
#[utoipa::path(put, path = "/v1/flows/{name}", tag = "admin", request_body = FlowBody,
    params(("name" = String, Path, description = "Flow name")),
    security(("admin_token" = [])),
    responses((status = 200, body = FlowRow), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub(crate) async fn put_flow(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<FlowBody>,
) -> Result<Json<FlowRow>, ApiError> {
    valid_name(&name, "flow name")?;
    let create_quota = body.create_quota.then_some(state.default_ceiling);
    let settings = body.settings().map_err(ApiError::Invalid)?;
    let row = state
        .store
        .put_flow(ADMIN_ACTOR, &name, &settings, create_quota)
        .await?;
    changed(&state, Json(row)).await
}

/// Change only the fields given (JSON merge patch). A `mode` without
/// `enforce_percent` is the whole mode; a percent outside enforce is refused.
/// A flow that does not exist is a 404: `PUT` creates.
#[utoipa::path(patch, path = "/v1/flows/{name}", tag = "admin", request_body(content = FlowPatch,
        content_type = "application/merge-patch+json"),
    params(("name" = String, Path, description = "Flow name")),
    security(("admin_token" = [])),
    responses((status = 200, body = FlowRow), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub(crate) async fn patch_flow(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(patch): ApiJson<FlowPatch>,
) -> Result<Json<FlowRow>, ApiError> {
    valid_name(&name, "flow name")?;
    if let Patch::Set(quota) = &patch.quota {
        valid_name(quota, "`quota`")?;
    }
    let create_quota = patch.create_quota.then_some(state.default_ceiling);
    let row = state
        .store
        .patch_flow(
            ADMIN_ACTOR,
            &name,
            patch,
            WhenMissing::NotFound,
            create_quota,
        )
        .await?;
    changed(&state, Json(row)).await
}

/// Delete a flow; 409 while work items of it are not done.
#[utoipa::path(delete, path = "/v1/flows/{name}", tag = "admin",
    params(("name" = String, Path, description = "Flow name")),
    security(("admin_token" = [])),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub(crate) async fn delete_flow(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    valid_name(&name, "flow name")?;
    state.store.delete_flow(ADMIN_ACTOR, &name).await?;
    changed(&state, StatusCode::NO_CONTENT).await
}

/// List flows with their modes.
#[utoipa::path(get, path = "/v1/flows", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = FlowList), (status = 401, body = Problem)))]
pub(crate) async fn list_flows(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<FlowList>, ApiError> {
    Ok(Json(FlowList {
        flows: state.store.list_flows().await?,
    }))
}
