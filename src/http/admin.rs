//! Admin API: quotas, flows and windows, behind the admin bearer token.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::extract::{Admin, ApiJson, ApiPath, ApiQuery};
use super::AppState;
use crate::catalog::{validate_name, FlowBody, FlowPatch, Patch, QuotaLimits, QuotaPatch};
use crate::report::{self, Report};
use crate::store::{FlowRow, QuotaRow, WhenMissing, WindowRow};

/// Who the audit trail names for changes made with the admin token.
pub(super) const ADMIN_ACTOR: &str = "api:admin";

/// At most a month of hourly windows in one answer.
const MAX_WINDOW_HOURS: i32 = 744;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_quotas))
        .routes(routes!(get_quota, put_quota, patch_quota, delete_quota))
        .routes(routes!(list_flows))
        .routes(routes!(get_flow, put_flow, patch_flow, delete_flow))
        .routes(routes!(list_windows))
        .routes(routes!(observe_report))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QuotaList {
    pub quotas: Vec<QuotaRow>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FlowList {
    pub flows: Vec<FlowRow>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WindowList {
    pub windows: Vec<WindowRow>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WindowQuery {
    /// Only this quota.
    pub quota: Option<String>,
    /// Hours to look back, the current one included (default 24, at most 744).
    #[param(minimum = 1, maximum = 744)]
    pub last: Option<i32>,
}

fn valid_name(name: &str, what: &str) -> Result<(), ApiError> {
    validate_name(name).map_err(|why| ApiError::Invalid(format!("{what} {why}")))
}

/// A quota named in a query must exist: a typo is a 404, not an empty answer.
async fn known_quota(state: &AppState, quota: Option<&str>) -> Result<(), ApiError> {
    let Some(quota) = quota else { return Ok(()) };
    valid_name(quota, "`quota`")?;
    match state.store.quota(quota).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::NotFound(format!("no quota `{quota}`"))),
    }
}

/// Every replica reloads on the catalog trigger's NOTIFY; this one reloads at
/// once so its own next answer already obeys the change.
pub(super) async fn changed<T>(state: &AppState, answer: T) -> Result<T, ApiError> {
    state.catalog.refresh(state.store.pool()).await?;
    Ok(answer)
}

/// One quota.
#[utoipa::path(get, path = "/v1/quotas/{name}", tag = "admin",
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 200, body = QuotaRow), (status = 401, body = Problem), (status = 404, body = Problem)))]
pub async fn get_quota(
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
pub async fn put_quota(
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
pub async fn patch_quota(
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
pub async fn delete_quota(
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
pub async fn list_quotas(
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
pub async fn get_flow(
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
pub async fn put_flow(
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
pub async fn patch_flow(
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
pub async fn delete_flow(
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
pub async fn list_flows(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<FlowList>, ApiError> {
    Ok(Json(FlowList {
        flows: state.store.list_flows().await?,
    }))
}

/// Recent windows with count, ceiling and tallies by outcome, newest first.
#[utoipa::path(get, path = "/v1/windows", tag = "admin", params(WindowQuery), security(("admin_token" = [])),
    responses((status = 200, body = WindowList), (status = 401, body = Problem),
        (status = 404, description = "No such quota", body = Problem), (status = 422, body = Problem)))]
pub async fn list_windows(
    _: Admin,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<WindowQuery>,
) -> Result<Json<WindowList>, ApiError> {
    let hours = query.last.unwrap_or(24);
    if !(1..=MAX_WINDOW_HOURS).contains(&hours) {
        return Err(ApiError::Invalid(format!(
            "`last` must be between 1 and {MAX_WINDOW_HOURS}"
        )));
    }
    known_quota(&state, query.quota.as_deref()).await?;
    Ok(Json(WindowList {
        windows: state
            .store
            .recent_windows(query.quota.as_deref(), hours)
            .await?,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    /// Only flows of this quota.
    pub quota: Option<String>,
    /// Period to look back, e.g. `7d`, `36h` (default 7d), from 1 hour to 366 days.
    pub since: Option<String>,
    /// What-if: recompute as if the ceiling were this value.
    #[param(minimum = 0, maximum = 9007199254740992_i64)]
    pub ceiling: Option<i64>,
}

/// What enforcement would have done to each flow still in observe mode.
#[utoipa::path(get, path = "/v1/report", tag = "admin", params(ReportQuery), security(("admin_token" = [])),
    responses((status = 200, body = Report), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub async fn observe_report(
    _: Admin,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ReportQuery>,
) -> Result<Json<Report>, ApiError> {
    let since = query.since.as_deref().unwrap_or("7d");
    crate::input::text(since).map_err(|why| ApiError::Invalid(format!("`since` {why}")))?;
    let since = report::parse_since(since).map_err(ApiError::Invalid)?;
    known_quota(&state, query.quota.as_deref()).await?;
    if query
        .ceiling
        .is_some_and(|c| !(0..=crate::catalog::MAX_CEILING).contains(&c))
    {
        return Err(ApiError::Invalid(format!(
            "`ceiling` must be between 0 and {}",
            crate::catalog::MAX_CEILING
        )));
    }
    let report = report::observe_report(
        &state.store,
        query.quota.as_deref(),
        since,
        query.ceiling,
        state.history_retention,
    )
    .await?;
    Ok(Json(report))
}
