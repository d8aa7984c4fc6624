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
use crate::domain::catalog::{FlowBody, FlowPatch, Patch, QuotaLimits, QuotaPatch};
use crate::domain::{FlowName, QuotaName};
use crate::store::{FlowRow, QuotaRow};

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

/// A quota's name from a path or a field (`what` names which, for the
/// problem's detail), parsed: a bad one is a 422 before any store call.
pub(super) fn quota_name(name: String, what: &str) -> Result<QuotaName, ApiError> {
    QuotaName::parse(name).map_err(|why| ApiError::Invalid(format!("{what} {why}")))
}

fn flow_name(name: String) -> Result<FlowName, ApiError> {
    FlowName::parse(name).map_err(|why| ApiError::Invalid(format!("flow name {why}")))
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
    let name = quota_name(name, "quota name")?;
    let row = state.administration.quota(&name).await?;
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
    let name = quota_name(name, "quota name")?;
    let settings = body
        .settings(state.administration.default_ceiling())
        .map_err(ApiError::Invalid)?;
    let row = state.administration.put_quota(&name, &settings).await?;
    Ok(Json(row))
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
    let name = quota_name(name, "quota name")?;
    let row = state.administration.patch_quota(&name, patch).await?;
    Ok(Json(row))
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
    let name = quota_name(name, "quota name")?;
    state.administration.delete_quota(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List quotas.
#[utoipa::path(get, path = "/v1/quotas", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = QuotaList), (status = 401, body = Problem)))]
pub(crate) async fn list_quotas(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<QuotaList>, ApiError> {
    Ok(Json(QuotaList {
        quotas: state.administration.list_quotas().await?,
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
    let name = flow_name(name)?;
    let row = state.administration.flow(&name).await?;
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
    let name = flow_name(name)?;
    let create_quota = body.create_quota;
    let settings = body.settings().map_err(ApiError::Invalid)?;
    let row = state
        .administration
        .put_flow(&name, &settings, create_quota)
        .await?;
    Ok(Json(row))
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
    let name = flow_name(name)?;
    if let Patch::Set(quota) = &patch.quota {
        quota_name(quota.clone(), "`quota`")?;
    }
    let create_quota = patch.create_quota;
    let row = state
        .administration
        .patch_flow(&name, patch, create_quota)
        .await?;
    Ok(Json(row))
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
    let name = flow_name(name)?;
    state.administration.delete_flow(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List flows with their modes.
#[utoipa::path(get, path = "/v1/flows", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = FlowList), (status = 401, body = Problem)))]
pub(crate) async fn list_flows(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<FlowList>, ApiError> {
    Ok(Json(FlowList {
        flows: state.administration.list_flows().await?,
    }))
}
