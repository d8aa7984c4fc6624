//! `POST /v1/reserve/batch`: ration many items in one request.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::reserve::ReserveBody;
use super::AppState;
use crate::arbiter::MAX_BATCH_ITEMS;
use crate::decision::{Decision, SlotRequest};

/// A batch's items have the shape of a `POST /v1/reserve` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    #[schema(min_items = 1, max_items = 500)]
    pub items: Vec<ReserveBody>,
}

/// One decision per item, in input order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchDecisions {
    pub decisions: Vec<BatchDecision>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchDecision {
    /// The item's `ref`, echoed.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    #[serde(flatten)]
    pub decision: Decision,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(reserve_batch))
}

/// Ration slots among a batch of items: deadline ASC NULLS LAST, then flow
/// priority, then input order. Items due within the bypass horizon are
/// `bypassed`; each enforced quota takes what its window has left in one
/// statement and shares it out in that order, each item all or nothing.
#[utoipa::path(
    post, path = "/v1/reserve/batch", tag = "reserve",
    request_body = BatchBody,
    responses(
        (status = 200, description = "One decision per item, in input order", body = BatchDecisions),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "An enforced item's quota store did not answer; nothing was granted",
         body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn reserve_batch(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<BatchBody>,
) -> Result<Json<BatchDecisions>, ApiError> {
    if body.items.is_empty() || body.items.len() > MAX_BATCH_ITEMS {
        return Err(ApiError::Invalid(format!(
            "`items` must hold between 1 and {MAX_BATCH_ITEMS} items"
        )));
    }
    let requests = body
        .items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            SlotRequest::new(item.flow, item.count, item.deadline, item.reference)
                .map_err(|why| ApiError::Invalid(format!("items[{i}]: {why}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let decisions = state.arbiter.decide_batch(&state.bypass, &requests).await?;
    Ok(Json(BatchDecisions {
        decisions: requests
            .into_iter()
            .zip(decisions)
            .map(|(request, decision)| BatchDecision {
                reference: request.reference,
                decision,
            })
            .collect(),
    }))
}
