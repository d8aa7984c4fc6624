//! The pending-work registry: enqueue, claim (a lease), done, release.
//! Workers are not admins: like `/v1/reserve`, these need no token.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::Json;
use chrono::{DateTime, Datelike, Utc};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::{ApiJson, ApiPath};
use super::reserve::check_spend;
use super::AppState;
use crate::domain::input;
use crate::domain::FlowName;
use crate::store::work::{Finish, RetryDelay};
use crate::store::{NewWork, WorkItem};
use crate::work_registry::{Claim, ClaimRequest, MAX_CLAIM};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(enqueue))
        .routes(routes!(claim))
        .routes(routes!(get_item))
        .routes(routes!(done))
        .routes(routes!(release))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnqueueBody {
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub(crate) flow: String,
    pub(crate) deadline: Option<DateTime<Utc>>,
    /// 1 (most important) to 9; default: the flow's priority.
    #[schema(minimum = 1, maximum = 9)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub(crate) priority: Option<i16>,
    /// What the worker needs to do the work (at most 8 KiB of JSON); none
    /// is `null`, for work that its `ref` alone names.
    #[serde(default)]
    #[schema(schema_with = crate::domain::input::schema::payload)]
    pub(crate) payload: serde_json::Value,
    /// Idempotency key: the same ref is the same item.
    #[serde(rename = "ref")]
    #[schema(schema_with = crate::domain::input::schema::optional_reference)]
    pub(crate) reference: Option<String>,
    /// What claiming it spends of the flow's quotas, by quota name
    /// (`{"llm-tokens": 3500}`, up to 10^9 each); a quota of the flow it
    /// does not name, one. The claim decides it like a reservation with
    /// `spend` (all or nothing, and a `reservation_id` to settle).
    #[serde(
        default,
        deserialize_with = "crate::domain::input::integer::optional_amounts"
    )]
    #[schema(schema_with = crate::domain::input::schema::spend)]
    pub(crate) spend: Option<std::collections::BTreeMap<String, i64>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimBody {
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub(crate) worker: String,
    /// Only these flows (default: every flow).
    #[schema(schema_with = crate::domain::input::schema::optional_names)]
    pub(crate) flows: Option<Vec<String>>,
    /// Most items to lease (default 1, at most 100).
    #[schema(minimum = 1, maximum = 100)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub(crate) max: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseBody {
    /// The worker that holds the claim.
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub(crate) worker: String,
}

/// Every claim spends a slot: a released item waits before it can be claimed
/// again. Name the wait with `retry_in` or `retry_at` (not both); with
/// neither, the wait grows with the item's attempts: 5 s after the first
/// claim, doubling with each further claim, at most 1 h. Never more than
/// 7 days ahead.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseBody {
    /// The worker that holds the claim.
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub(crate) worker: String,
    /// Claimable again after this long: a duration like `30s`, `5m`, `1h 30m`.
    #[schema(schema_with = crate::domain::input::schema::optional_duration)]
    pub(crate) retry_in: Option<String>,
    /// Claimable again at this time (RFC 3339 with a zone); a time past means now.
    pub(crate) retry_at: Option<DateTime<Utc>>,
}

impl ReleaseBody {
    fn retry_delay(&self) -> Result<RetryDelay, ApiError> {
        match (&self.retry_in, self.retry_at) {
            (Some(_), Some(_)) => Err(ApiError::Invalid(
                "give `retry_in` or `retry_at`, not both".into(),
            )),
            (Some(text), None) => input::text(text)
                .map_err(invalid("`retry_in`"))
                .and_then(|()| {
                    humantime::parse_duration(text)
                        .map(RetryDelay::After)
                        .map_err(|e| {
                            ApiError::Invalid(format!(
                                "`retry_in`: `{text}` is not a duration like 30s or 5m: {e}"
                            ))
                        })
                }),
            (None, Some(at)) => Ok(RetryDelay::At(rfc3339_time("retry_at", at)?)),
            (None, None) => Ok(RetryDelay::Backoff),
        }
    }
}

fn invalid(what: &str) -> impl Fn(String) -> ApiError + '_ {
    move |why| ApiError::Invalid(format!("{what} {why}"))
}

/// RFC 3339 years have four digits; the parser takes more, which the store
/// cannot hold: refused here rather than failing there.
fn rfc3339_time(what: &str, time: DateTime<Utc>) -> Result<DateTime<Utc>, ApiError> {
    if (0..=9999).contains(&time.year()) {
        return Ok(time);
    }
    Err(ApiError::Invalid(format!(
        "`{what}` must be a time between the years 0000 and 9999"
    )))
}

/// Enqueue work. 201 for a new item; 200 with the existing item for a `ref` seen before.
#[utoipa::path(post, path = "/v1/work", tag = "work", request_body = EnqueueBody,
    responses((status = 201, body = WorkItem), (status = 200, description = "Same ref: the existing item", body = WorkItem),
        (status = 422, body = Problem), (status = 503, body = Problem)))]
pub(crate) async fn enqueue(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<EnqueueBody>,
) -> Result<(StatusCode, Json<WorkItem>), ApiError> {
    let flow = FlowName::parse(body.flow).map_err(invalid("`flow`"))?;
    if body.priority.is_some_and(|p| !(1..=9).contains(&p)) {
        return Err(ApiError::Invalid(
            "`priority` must be between 1 and 9".into(),
        ));
    }
    if let Some(reference) = &body.reference {
        input::reference(reference).map_err(invalid("`ref`"))?;
    }
    if let Some(deadline) = body.deadline {
        rfc3339_time("deadline", deadline)?;
    }
    input::payload(&body.payload).map_err(invalid("`payload`"))?;
    if let Some(spend) = &body.spend {
        check_spend(&state, flow.as_str(), spend, false).map_err(ApiError::Invalid)?;
    }
    let work = NewWork {
        flow,
        reference: body.reference,
        deadline: body.deadline,
        priority: body.priority,
        payload: body.payload,
        spend: body.spend,
    };
    let (item, created) = state.work_registry.enqueue(work).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(item)))
}

/// Lease the most urgent items whose slot can be had now. Nothing grantable is
/// `deferred` (with `retry_at` and `Retry-After`), never an error.
#[utoipa::path(post, path = "/v1/work/claim", tag = "work", request_body = ClaimBody,
    responses((status = 200, body = Claim,
        headers(("Retry-After" = u64, description = "On deferral: seconds until retry_at, rounded up"))),
        (status = 422, body = Problem), (status = 503, body = Problem)))]
pub(crate) async fn claim(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<ClaimBody>,
) -> Result<(HeaderMap, Json<Claim>), ApiError> {
    input::name(&body.worker).map_err(invalid("`worker`"))?;
    let flows = body
        .flows
        .map(|flows| flows.into_iter().map(FlowName::parse).collect())
        .transpose()
        .map_err(invalid("`flows` entry"))?;
    let max = body.max.unwrap_or(1);
    if !(1..=MAX_CLAIM).contains(&max) {
        return Err(ApiError::Invalid(format!(
            "`max` must be between 1 and {MAX_CLAIM}"
        )));
    }
    let request = ClaimRequest {
        worker: body.worker,
        flows,
        max,
        lease: state.lease_duration,
        key_id: caller.0.as_ref().and_then(|principal| principal.key_id),
    };
    let claim = state.work_registry.claim(&state.bypass, &request).await?;
    let leases = claim.items.iter().filter_map(|c| c.decision.lease_id);
    caller.took(&state, leases).await;
    let mut headers = HeaderMap::new();
    if let Some(seconds) = claim.retry_after_seconds {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    Ok((headers, Json(claim)))
}

/// One work item.
#[utoipa::path(get, path = "/v1/work/{id}", tag = "work",
    params(("id" = i64, Path, description = "Work item id")),
    responses((status = 200, body = WorkItem), (status = 404, body = Problem)))]
pub(crate) async fn get_item(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<WorkItem>, ApiError> {
    state
        .work_registry
        .work_item(id)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound("no such work item".into()))
}

/// The leased item was emitted. Repeated by the worker that emitted it, it
/// answers the item again.
#[utoipa::path(post, path = "/v1/work/{id}/done", tag = "work", request_body = LeaseBody,
    params(("id" = i64, Path, description = "Work item id")),
    responses((status = 200, body = WorkItem), (status = 404, body = Problem),
        (status = 409, description = "The worker does not hold this item's claim, or another worker already finished it",
         body = Problem)))]
pub(crate) async fn done(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<LeaseBody>,
) -> Result<Json<WorkItem>, ApiError> {
    finish(&state, id, &body.worker, Finish::Done).await
}

/// Give the leased item back (not emitted): pending again, claimable after
/// its retry delay (`not_before`); its slot stays spent.
#[utoipa::path(post, path = "/v1/work/{id}/release", tag = "work", request_body = ReleaseBody,
    params(("id" = i64, Path, description = "Work item id")),
    responses((status = 200, body = WorkItem), (status = 404, body = Problem),
        (status = 409, description = "The worker does not hold this item's claim, or the item is already done",
         body = Problem),
        (status = 422, description = "Both `retry_in` and `retry_at`, or a bad duration", body = Problem)))]
pub(crate) async fn release(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<ReleaseBody>,
) -> Result<Json<WorkItem>, ApiError> {
    let delay = body.retry_delay()?;
    finish(&state, id, &body.worker, Finish::Release(delay)).await
}

async fn finish(
    state: &AppState,
    id: i64,
    worker: &str,
    how: Finish,
) -> Result<Json<WorkItem>, ApiError> {
    input::name(worker).map_err(invalid("`worker`"))?;
    if let Some(item) = state.work_registry.finish_work(id, worker, how).await? {
        return Ok(Json(item));
    }
    match state.work_registry.work_item(id).await? {
        None => Err(ApiError::NotFound("no such work item".into())),
        Some(item) if item.state == "done" => Err(ApiError::Conflict(format!(
            "work item {id} is already done"
        ))),
        Some(_) => Err(ApiError::Conflict(format!(
            "worker `{worker}` does not hold the claim of work item {id}"
        ))),
    }
}
