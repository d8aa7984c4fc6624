//! Admin API: quotas, flows and windows, behind the admin bearer token.

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::extract::{Admin, ApiJson, ApiQuery};
use super::AppState;
use crate::catalog::{validate_name, Mode};
use crate::store::{FlowRow, QuotaRow, WindowRow};

/// At most a month of hourly windows in one answer.
const MAX_WINDOW_HOURS: i32 = 744;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_quota))
        .routes(routes!(list_quotas))
        .routes(routes!(put_flow))
        .routes(routes!(list_flows))
        .routes(routes!(list_windows))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    /// Slots per UTC hour; defaults to QUOTA_HOURLY_CEILING. Below 1 refuses everything.
    pub hourly_ceiling: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowBody {
    pub quota: String,
    /// `observe` when a new flow names none; an existing flow keeps its mode.
    pub mode: Option<Mode>,
    #[schema(minimum = 1, maximum = 9)]
    pub priority: Option<i16>,
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
#[serde(deny_unknown_fields)]
pub struct WindowQuery {
    /// Only this quota.
    pub quota: Option<String>,
    /// Hours to look back, the current one included (default 24, at most 744).
    pub last: Option<i32>,
}

fn valid_name(name: &str, what: &str) -> Result<(), ApiError> {
    validate_name(name).map_err(|why| ApiError::Invalid(format!("{what} {why}")))
}

/// Create or update a quota.
#[utoipa::path(put, path = "/v1/quotas/{name}", tag = "admin", request_body = QuotaBody,
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 200, body = QuotaRow), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub async fn put_quota(
    _: Admin,
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<QuotaBody>,
) -> Result<Json<QuotaRow>, ApiError> {
    valid_name(&name, "quota name")?;
    let ceiling = body.hourly_ceiling.unwrap_or(state.default_ceiling);
    if ceiling < 0 {
        return Err(ApiError::Invalid(
            "`hourly_ceiling` must be 0 or more".into(),
        ));
    }
    let row = state.store.put_quota(&name, ceiling).await?;
    state.catalog.refresh(state.store.pool()).await?;
    Ok(Json(row))
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

/// Create or update a flow; a quota it names that does not exist yet is created
/// with the default ceiling.
#[utoipa::path(put, path = "/v1/flows/{name}", tag = "admin", request_body = FlowBody,
    params(("name" = String, Path, description = "Flow name")),
    security(("admin_token" = [])),
    responses((status = 200, body = FlowRow), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub async fn put_flow(
    _: Admin,
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<FlowBody>,
) -> Result<Json<FlowRow>, ApiError> {
    valid_name(&name, "flow name")?;
    valid_name(&body.quota, "`quota`")?;
    if body.priority.is_some_and(|p| !(1..=9).contains(&p)) {
        return Err(ApiError::Invalid(
            "`priority` must be between 1 and 9".into(),
        ));
    }
    let row = state
        .store
        .put_flow(
            &name,
            &body.quota,
            body.mode,
            body.priority,
            state.default_ceiling,
        )
        .await?;
    state.catalog.refresh(state.store.pool()).await?;
    Ok(Json(row))
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
    responses((status = 200, body = WindowList), (status = 401, body = Problem), (status = 422, body = Problem)))]
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
    if let Some(quota) = &query.quota {
        valid_name(quota, "`quota`")?;
    }
    Ok(Json(WindowList {
        windows: state
            .store
            .recent_windows(query.quota.as_deref(), hours)
            .await?,
    }))
}
