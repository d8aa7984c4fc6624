//! Admin API: route classes, the admission profiles (design.md §11), with
//! the conventions of quotas and flows: `PUT` replaces the whole class,
//! `PATCH` changes the fields given, `GET` reads one or all, `DELETE` removes
//! one. Admin role.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::extract::{Admin, ApiJson, ApiPath};
use super::AppState;
use crate::domain::admission::{RouteClassPatch, RouteClassSettings};
use crate::domain::catalog::validate_name;
use crate::store::RouteClassRow;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_route_classes))
        .routes(routes!(
            get_route_class,
            put_route_class,
            patch_route_class,
            delete_route_class
        ))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RouteClassList {
    pub(crate) route_classes: Vec<RouteClassRow>,
}

fn valid_name(name: &str) -> Result<(), ApiError> {
    validate_name(name).map_err(|why| ApiError::Invalid(format!("route class name {why}")))
}

/// One route class.
#[utoipa::path(get, path = "/v1/route-classes/{name}", tag = "admin",
    params(("name" = String, Path, description = "Route class name")),
    security(("admin_token" = [])),
    responses((status = 200, body = RouteClassRow), (status = 401, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn get_route_class(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<RouteClassRow>, ApiError> {
    valid_name(&name)?;
    let row = state.administration.route_class(&name).await?;
    row.map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no route class `{name}`")))
}

/// Create a route class or replace all its settings (every field required).
#[utoipa::path(put, path = "/v1/route-classes/{name}", tag = "admin", request_body = RouteClassSettings,
    params(("name" = String, Path, description = "Route class name")),
    security(("admin_token" = [])),
    responses((status = 200, body = RouteClassRow), (status = 401, body = Problem), (status = 422, body = Problem)))]
pub(crate) async fn put_route_class(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<RouteClassSettings>,
) -> Result<Json<RouteClassRow>, ApiError> {
    valid_name(&name)?;
    let settings = body.validated().map_err(ApiError::Invalid)?;
    let row = state
        .administration
        .put_route_class(&name, &settings)
        .await?;
    Ok(Json(row))
}

/// Change only the fields given (JSON merge patch); every setting is
/// required, so `null` is refused. The class must exist (404; PUT creates).
#[utoipa::path(patch, path = "/v1/route-classes/{name}", tag = "admin", request_body(content = RouteClassPatch,
        content_type = "application/merge-patch+json"),
    params(("name" = String, Path, description = "Route class name")),
    security(("admin_token" = [])),
    responses((status = 200, body = RouteClassRow), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub(crate) async fn patch_route_class(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(patch): ApiJson<RouteClassPatch>,
) -> Result<Json<RouteClassRow>, ApiError> {
    valid_name(&name)?;
    let row = state.administration.patch_route_class(&name, patch).await?;
    Ok(Json(row))
}

/// Delete a route class and its admission counts.
#[utoipa::path(delete, path = "/v1/route-classes/{name}", tag = "admin",
    params(("name" = String, Path, description = "Route class name")),
    security(("admin_token" = [])),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn delete_route_class(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    valid_name(&name)?;
    state.administration.delete_route_class(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List route classes.
#[utoipa::path(get, path = "/v1/route-classes", tag = "admin", security(("admin_token" = [])),
    responses((status = 200, body = RouteClassList), (status = 401, body = Problem)))]
pub(crate) async fn list_route_classes(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<RouteClassList>, ApiError> {
    Ok(Json(RouteClassList {
        route_classes: state.administration.list_route_classes().await?,
    }))
}
