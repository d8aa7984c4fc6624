//! What operators read: recent windows, the observe-mode report and the
//! Prometheus metrics (the dashboard, `/`, is `dashboard.rs`).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::admin::quota_name;
use super::error::{ApiError, Problem};
use super::extract::{Admin, ApiQuery};
use super::AppState;
use crate::domain::QuotaName;
use crate::metrics;
use crate::report::{self, Report, WhatIf};
use crate::store::WindowRow;

/// At most a month of hourly windows in one answer.
const MAX_WINDOW_HOURS: i32 = 744;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_windows))
        .routes(routes!(observe_report))
        .routes(routes!(metrics))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WindowList {
    pub(crate) windows: Vec<WindowRow>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct WindowQuery {
    /// Only this quota.
    pub(crate) quota: Option<String>,
    /// Hours to look back, the current one included (default 24, at most 744).
    #[param(minimum = 1, maximum = 744)]
    pub(crate) last: Option<i32>,
}

/// A quota named in a query must exist: a typo is a 404, not an empty answer.
async fn known_quota(
    state: &AppState,
    quota: Option<String>,
) -> Result<Option<QuotaName>, ApiError> {
    let Some(quota) = quota else { return Ok(None) };
    let quota = quota_name(quota, "`quota`")?;
    match state.administration.quota(&quota).await? {
        Some(_) => Ok(Some(quota)),
        None => Err(ApiError::NotFound(format!("no quota `{quota}`"))),
    }
}

/// Recent windows with count, ceiling and tallies by outcome, newest first.
#[utoipa::path(get, path = "/v1/windows", tag = "admin", params(WindowQuery), security(("admin_token" = [])),
    responses((status = 200, body = WindowList), (status = 401, body = Problem),
        (status = 404, description = "No such quota", body = Problem), (status = 422, body = Problem)))]
pub(crate) async fn list_windows(
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
    let quota = known_quota(&state, query.quota).await?;
    Ok(Json(WindowList {
        windows: state
            .administration
            .recent_windows(quota.as_ref(), hours)
            .await?,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReportQuery {
    /// Only flows of this quota.
    pub(crate) quota: Option<String>,
    /// Period to look back, e.g. `7d`, `36h` (default 7d), from 1 hour to 366 days.
    pub(crate) since: Option<String>,
    /// What-if: as if the quotas' `1h` windows had this ceiling.
    #[param(minimum = 0, maximum = 9007199254740992_i64)]
    pub(crate) ceiling: Option<i64>,
    /// What-if per window: `PERIOD=CEILING`, comma-separated (`1m=400,1d=8000`),
    /// as if the quotas' windows of those periods had those ceilings.
    #[param(
        example = "1m=400,1d=8000",
        pattern = "^[0-9a-z]{2,6}=[0-9]{1,16}(,[0-9a-z]{2,6}=[0-9]{1,16}){0,15}$"
    )]
    pub(crate) what_if: Option<String>,
}

/// What enforcement would have done to each flow still in observe mode.
#[utoipa::path(get, path = "/v1/report", tag = "admin", params(ReportQuery), security(("admin_token" = [])),
    responses((status = 200, body = Report), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub(crate) async fn observe_report(
    _: Admin,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ReportQuery>,
) -> Result<Json<Report>, ApiError> {
    let since = query.since.as_deref().unwrap_or("7d");
    crate::domain::input::text(since).map_err(|why| ApiError::Invalid(format!("`since` {why}")))?;
    let since = report::parse_since(since).map_err(ApiError::Invalid)?;
    let what_if =
        WhatIf::parse(query.what_if.as_deref(), query.ceiling).map_err(ApiError::Invalid)?;
    let quota = known_quota(&state, query.quota).await?;
    let report = state
        .administration
        .observe_report(quota.as_ref(), since, &what_if)
        .await?
        .map_err(ApiError::Invalid)?;
    Ok(Json(report))
}

/// Prometheus text exposition (format 0.0.4).
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    state.administration.gauge_state().await;
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}
