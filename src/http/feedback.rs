//! `POST /v1/report`: what happened upstream after an emission. Frees the
//! grant's concurrency lease and teaches the adaptive cadence.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::AppState;
use crate::catalog::validate_name;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(report_upstream))
}

/// How the upstream answered the emission.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, ToSchema)]
pub enum Upstream {
    #[serde(rename = "429")]
    TooManyRequests,
    #[serde(rename = "timeout")]
    Timeout,
    #[serde(rename = "5xx")]
    ServerError,
    #[serde(rename = "2xx")]
    Success,
}

impl Upstream {
    /// Multiplicative change to the cadence: back off hard on 429, gently on
    /// other failures, creep back up on success.
    fn multiplier(self) -> f64 {
        match self {
            Upstream::TooManyRequests => 0.7,
            Upstream::Timeout => 0.8,
            Upstream::ServerError => 0.9,
            Upstream::Success => 1.05,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackBody {
    pub flow: String,
    /// The upstream's answer; adapts the quota's cadence when it is adaptive.
    pub upstream: Option<Upstream>,
    /// The lease of the grant, to free its concurrency slot.
    pub lease_id: Option<i64>,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct FeedbackAnswer {
    /// Whether the lease was still held (an expired one may have been reused).
    pub released: Option<bool>,
    pub held_seconds: Option<f64>,
    /// The flow's moving average hold time; leases last twice this, 5-60 s.
    pub avg_lease_seconds: Option<f64>,
    /// Adaptive factor (0-1] applied to rate and burst, when adapted.
    pub factor: Option<f64>,
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
}

/// Report an emission's upstream outcome and/or free its lease.
#[utoipa::path(post, path = "/v1/report", tag = "reserve", request_body = FeedbackBody,
    responses((status = 200, body = FeedbackAnswer), (status = 422, body = Problem)))]
pub async fn report_upstream(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<FeedbackBody>,
) -> Result<Json<FeedbackAnswer>, ApiError> {
    validate_name(&body.flow).map_err(|why| ApiError::Invalid(format!("`flow` {why}")))?;
    if body.upstream.is_none() && body.lease_id.is_none() {
        return Err(ApiError::Invalid(
            "give `upstream`, `lease_id` or both".into(),
        ));
    }
    let mut answer = FeedbackAnswer::default();
    if let Some(lease_id) = body.lease_id {
        let released = state.store.release_lease(lease_id).await?;
        answer.released = Some(released.is_some());
        answer.held_seconds = released.as_ref().map(|r| r.held_seconds);
        answer.avg_lease_seconds = released.map(|r| r.avg_seconds);
    }
    let quota = state
        .catalog
        .snapshot()
        .and_then(|s| s.rule(&body.flow))
        .map(|rule| rule.quota.name);
    if let (Some(upstream), Some(quota)) = (body.upstream, quota) {
        if let Some(adapted) = state
            .store
            .adapt_cadence(&quota, upstream.multiplier())
            .await?
        {
            answer.factor = Some(adapted.factor);
            answer.effective_rate = Some(adapted.effective_rate);
            answer.effective_burst = Some(adapted.effective_burst);
        }
    }
    Ok(Json(answer))
}
