//! `POST /v1/settle`: an estimate settled to the actual (design.md §12).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::AppState;
use crate::auth::Role;
use crate::reservations::{SettleError, Settler};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleBody {
    /// The `reservation_id` of the grant (a string of digits).
    #[serde(deserialize_with = "crate::domain::input::exact_id::required")]
    #[schema(schema_with = crate::domain::input::exact_id::required_input_schema)]
    pub(crate) reservation_id: i64,
    /// What the call actually spent of the reservation's quotas, by quota
    /// name (`{"llm-tokens": 2310}`); a quota left out: spent as estimated.
    #[serde(default, deserialize_with = "crate::domain::input::integer::amounts")]
    #[schema(schema_with = crate::domain::input::schema::spent)]
    pub(crate) spent: BTreeMap<String, i64>,
}

/// A settlement: of the flow's own quota (the one answers name), and of
/// every quota the reservation spent in `quotas`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SettleAnswer {
    #[schema(value_type = String)]
    #[serde(serialize_with = "crate::domain::input::exact_id::string")]
    pub(crate) reservation_id: i64,
    pub(crate) flow: String,
    #[serde(flatten)]
    pub(crate) own: SettledQuota,
    /// Every quota the reservation spent, the flow's own first.
    pub(crate) quotas: Vec<SettledQuota>,
    /// The windows still open that changed, with their counts after.
    pub(crate) windows: Vec<SettledWindowAnswer>,
}

/// What a settlement did to one quota.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct SettledQuota {
    pub(crate) quota: String,
    /// The slots the reservation took.
    pub(crate) estimated: i64,
    /// The slots it spent: what is counted now.
    pub(crate) spent: i64,
    /// Slots given back to the windows still open (`estimated - spent`).
    pub(crate) given_back: i64,
    /// Slots taken past the estimate, without a ceiling; tallied `overspent`.
    pub(crate) overspent: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SettledWindowAnswer {
    pub(crate) quota: String,
    pub(crate) period: String,
    pub(crate) count: i64,
}

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(settle))
}

/// Settle a reservation's estimate to what was actually spent: give back
/// what was over-estimated to the windows it was taken from that are still
/// open, or take what was under-estimated without refusal. Once, within
/// `settle_within` of the reservation, by the key that reserved or an admin.
#[utoipa::path(
    post, path = "/v1/settle", tag = "reserve",
    request_body = SettleBody,
    responses(
        (status = 200, description = "Settled", body = SettleAnswer),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Reserved by another key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such reservation", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Settled already, or past its time to settle", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store did not answer", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn settle(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<SettleBody>,
) -> Result<Json<SettleAnswer>, ApiError> {
    if body
        .spent
        .values()
        .any(|n| !(0..=crate::domain::decision::MAX_SPEND).contains(n))
    {
        return Err(ApiError::Invalid(format!(
            "`spent` must be between 0 and {}",
            crate::domain::decision::MAX_SPEND
        )));
    }
    let settler = match &caller.0 {
        None => Settler::Anyone,
        Some(principal) if principal.role == Role::Admin => Settler::Admin,
        Some(principal) => principal.key_id.map_or(Settler::Anyone, Settler::Key),
    };
    let id = body.reservation_id;
    let settled = state
        .reservations
        .settle(id, &body.spent, settler)
        .await
        .map_err(|error| match error {
            SettleError::NotFound(_) => ApiError::NotFound(error.to_string()),
            SettleError::NotYours(_) => ApiError::Forbidden(error.to_string()),
            SettleError::AlreadySettled(_) | SettleError::TooLate(_) => {
                ApiError::Conflict(error.to_string())
            }
            SettleError::Invalid(why) => ApiError::Invalid(why),
            SettleError::Store(error) => error.into(),
        })?;
    let quotas: Vec<SettledQuota> = settled
        .quotas
        .into_iter()
        .map(|(quota, estimated, spent)| SettledQuota {
            quota,
            estimated,
            spent,
            given_back: (estimated - spent).max(0),
            overspent: (spent - estimated).max(0),
        })
        .collect();
    let own = quotas
        .first()
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no reservation {id} to settle")))?;
    Ok(Json(SettleAnswer {
        reservation_id: id,
        flow: settled.flow,
        own,
        quotas,
        windows: settled
            .windows
            .into_iter()
            .map(|w| SettledWindowAnswer {
                quota: w.quota,
                period: w.period,
                count: w.count,
            })
            .collect(),
    }))
}
