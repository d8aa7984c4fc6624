//! `POST /v1/reserve`: ask before each emission. The answer carries the
//! flow's quota in the RateLimit fields (design.md §4).

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::AppState;
use crate::decision::{Decision, SlotRequest, QUOTA_WINDOW_SECONDS};
use crate::ratelimit_fields;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    /// The flow that spends the quota.
    #[schema(schema_with = crate::input::schema::name)]
    pub flow: String,
    /// Slots to reserve, all or nothing (default 1).
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "crate::input::integer::optional")]
    pub count: Option<i64>,
    /// Work due within the bypass horizon (or already past) is granted as `bypassed`.
    #[serde(default, deserialize_with = "super::extract::optional_timestamp")]
    pub deadline: Option<DateTime<Utc>>,
    /// The caller's reference, echoed in logs.
    #[serde(rename = "ref")]
    #[schema(schema_with = crate::input::schema::optional_reference)]
    pub reference: Option<String>,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(reserve))
}

/// Ask for slots before an emission. Every business outcome is HTTP 200.
#[utoipa::path(
    post, path = "/v1/reserve", tag = "reserve",
    request_body = ReserveBody,
    responses(
        (status = 200, description = "A decision: granted, deferred, bypassed or unthrottled", body = Decision,
         headers(
            ("Retry-After" = u64, description = "On deferral: seconds until retry_at, rounded up"),
            ("RateLimit-Policy" = String, description = "When the flow's quota is known: \"<quota>\";q=<the ceiling of the flow's priority>;w=3600 (the hourly window)"),
            ("RateLimit" = String, description = "When the store counted this decision (enforce and observe modes): \"<quota>\";r=<slots left in the window>;t=<seconds until the window ends>; on a deferral r=0 and t is Retry-After"),
         )),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Enforced flow and the store did not answer", body = Problem,
         content_type = "application/problem+json",
         // Retry-After: `contract::document_failures`, on every 503.
         headers(
            ("RateLimit-Policy" = String, description = "When the flow's quota is known: as on a 200 (no RateLimit field: nothing was counted)"),
         )),
    )
)]
pub async fn reserve(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<ReserveBody>,
) -> Result<(HeaderMap, Json<Decision>), (HeaderMap, ApiError)> {
    let request = SlotRequest::new(body.flow, body.count, body.deadline, body.reference)
        .map_err(|why| (HeaderMap::new(), ApiError::Invalid(why)))?;
    // Deadline work goes first, down a path that holds no reservation store.
    let decision = match state.bypass.try_bypass(&request) {
        Some(decision) => decision,
        None => match state.arbiter.decide(&request).await {
            Ok(decision) => decision,
            Err(error) => return Err((unanswered_fields(&state, &request.flow), error.into())),
        },
    };
    caller.took(&state, decision.lease_id).await;
    let mut headers = HeaderMap::new();
    if let Some(seconds) = decision.retry_after_seconds {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    quota_fields(&mut headers, &decision);
    Ok((headers, Json(decision)))
}

/// A 503: the store gave no count, so only the policy of the flow's quota
/// (when the catalog knows it); what is left is never guessed.
fn unanswered_fields(state: &AppState, flow: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(rule) = state.catalog.snapshot().and_then(|s| s.rule(flow)) {
        let ceiling = rule.quota.ceiling_for(rule.flow.priority);
        insert_policy(&mut headers, &rule.quota.name, ceiling);
    }
    headers
}

/// The RateLimit fields of the flow's quota (design.md §4): the policy when
/// the quota is known, what is left only when the store counted this
/// decision; never a guess.
fn quota_fields(headers: &mut HeaderMap, decision: &Decision) {
    let (Some(quota), Some(limit)) = (&decision.quota, decision.quota_limit) else {
        return;
    };
    insert_policy(headers, quota, limit.ceiling);
    if let Some(left) = limit.left {
        let field = ratelimit_fields::limit_field(quota, left.slots, Some(left.reset));
        ratelimit_fields::insert(headers, ratelimit_fields::LIMIT, field);
    }
}

/// `quota`'s policy for a flow whose priority may use up to `ceiling` slots
/// of each hourly window.
fn insert_policy(headers: &mut HeaderMap, quota: &str, ceiling: i64) {
    let ceiling = u64::try_from(ceiling).unwrap_or(0);
    let policy = ratelimit_fields::policy_field(quota, ceiling, QUOTA_WINDOW_SECONDS);
    ratelimit_fields::insert(headers, ratelimit_fields::POLICY, policy);
}
