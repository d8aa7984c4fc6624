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
use crate::report::{self, Report};
use crate::store::{FlowChange, FlowRow, QuotaLimits, QuotaRow, WindowRow};

/// Who the audit trail names for changes made with the admin token.
const ADMIN_ACTOR: &str = "api:admin";

/// At most a month of hourly windows in one answer.
const MAX_WINDOW_HOURS: i32 = 744;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_quota))
        .routes(routes!(list_quotas))
        .routes(routes!(put_flow))
        .routes(routes!(list_flows))
        .routes(routes!(list_windows))
        .routes(routes!(observe_report))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowBody {
    pub quota: String,
    /// `observe` when a new flow names none; an existing flow keeps its mode.
    pub mode: Option<Mode>,
    #[schema(minimum = 1, maximum = 9)]
    pub priority: Option<i16>,
    /// Enforce mode: share of over-ceiling decisions actually deferred (100 = all).
    #[schema(minimum = 1, maximum = 100)]
    pub enforce_percent: Option<i16>,
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
#[utoipa::path(put, path = "/v1/quotas/{name}", tag = "admin", request_body = QuotaLimits,
    params(("name" = String, Path, description = "Quota name")),
    security(("admin_token" = [])),
    responses((status = 200, body = QuotaRow), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub async fn put_quota(
    _: Admin,
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<QuotaLimits>,
) -> Result<Json<QuotaRow>, ApiError> {
    valid_name(&name, "quota name")?;
    let settings = body
        .settings(state.default_ceiling)
        .map_err(ApiError::Invalid)?;
    let row = state.store.put_quota(ADMIN_ACTOR, &name, &settings).await?;
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
    if body
        .enforce_percent
        .is_some_and(|p| !(1..=100).contains(&p))
    {
        return Err(ApiError::Invalid(
            "`enforce_percent` must be between 1 and 100".into(),
        ));
    }
    let change = FlowChange {
        quota: body.quota,
        mode: body.mode,
        priority: body.priority,
        enforce_percent: body.enforce_percent,
    };
    let row = state
        .store
        .put_flow(ADMIN_ACTOR, &name, &change, state.default_ceiling)
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

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    /// Only flows of this quota.
    pub quota: Option<String>,
    /// Period to look back, e.g. `7d`, `36h` (default 7d).
    pub since: Option<String>,
    /// What-if: recompute as if the ceiling were this value.
    pub ceiling: Option<i64>,
}

/// What enforcement would have done to each flow still in observe mode.
#[utoipa::path(get, path = "/v1/report", tag = "admin", params(ReportQuery), security(("admin_token" = [])),
    responses((status = 200, body = Report), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub async fn observe_report(
    _: Admin,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ReportQuery>,
) -> Result<Json<Report>, ApiError> {
    let since =
        report::parse_since(query.since.as_deref().unwrap_or("7d")).map_err(ApiError::Invalid)?;
    if let Some(quota) = &query.quota {
        valid_name(quota, "`quota`")?;
    }
    if query.ceiling.is_some_and(|c| c < 0) {
        return Err(ApiError::Invalid("`ceiling` must be 0 or more".into()));
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
