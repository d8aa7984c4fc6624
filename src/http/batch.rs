//! `POST /v1/reserve/batch`: ration many items in one request.

use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::reserve::{drawn_on, quota_fields, unanswered_fields, ReserveBody};
use super::AppState;
use crate::domain::catalog::{MAX_FLOW_QUOTAS, MAX_NAME_LEN};
use crate::domain::decision::{Decision, MAX_COUNT, MAX_REF_LEN, MAX_SPEND};
use crate::reservations::MAX_BATCH_ITEMS;

/// The body of the largest batch the route accepts, so that the documented
/// maximum always fits (the rest of the API keeps the general limit): every
/// item at its longest, with every character of its `ref` and `flow` in the
/// longest form JSON can write it (`\u002f`, or a pair of escaped
/// surrogates), pretty-printed.
pub const MAX_BATCH_BODY_BYTES: usize =
    BATCH_ENVELOPE_BYTES + MAX_BATCH_ITEMS * (MAX_BATCH_ITEM_BYTES + ",".len());

/// `\u00XX`: six bytes for one character of a name (ASCII).
const ESCAPED_CHAR_BYTES: usize = "\\u0000".len();
/// A `ref` counts characters, and one beyond the BMP is written as an
/// escaped UTF-16 pair: twelve bytes.
const ESCAPED_REF_CHAR_BYTES: usize = "\\ud83d\\ude00".len();
/// The longest RFC 3339 time: nanoseconds and an offset.
const MAX_DEADLINE_BYTES: usize = "0000-00-00T00:00:00.000000000+00:00".len();
/// Pretty-printing: a line break and up to 8 spaces of indentation on each
/// of an item's 8 lines (braces and 6 fields), and a space after each colon.
const PRETTY_ITEM_BYTES: usize = 8 * ("\n".len() + 8) + 6;
const MAX_BATCH_ITEM_BYTES: usize =
    r#"{"ref":"","flow":"","count":,"deadline":"","settle":false,"spend":{}}"#.len()
        + MAX_REF_LEN * ESCAPED_REF_CHAR_BYTES
        + MAX_NAME_LEN * ESCAPED_CHAR_BYTES
        + decimal_digits(MAX_COUNT)
        + MAX_DEADLINE_BYTES
        + MAX_FLOW_QUOTAS * MAX_SPEND_BYTES
        + PRETTY_ITEM_BYTES;
/// One quota's amount in `spend`: its name escaped, a colon, a space and the
/// largest amount, a comma, on a line of its own indented up to 12 spaces.
const MAX_SPEND_BYTES: usize = r#""": ,"#.len()
    + MAX_NAME_LEN * ESCAPED_CHAR_BYTES
    + decimal_digits(MAX_SPEND)
    + "\n".len()
    + 12;
/// `{"items": […]}` on its own lines.
const BATCH_ENVELOPE_BYTES: usize = r#"{"items":[]}"#.len() + 3 * ("\n".len() + 8) + 1;

const fn decimal_digits(mut n: i64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// A batch's items have the shape of a `POST /v1/reserve` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchBody {
    #[schema(min_items = 1, max_items = 500)]
    pub(crate) items: Vec<ReserveBody>,
}

/// One decision per item, in input order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct BatchDecisions {
    pub(crate) decisions: Vec<BatchDecision>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct BatchDecision {
    /// The item's `ref`, echoed.
    #[serde(rename = "ref")]
    pub(crate) reference: Option<String>,
    #[serde(flatten)]
    pub(crate) decision: Decision,
}

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(reserve_batch))
        .layer(DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES))
}

/// Ration slots among a batch of items: deadline ASC NULLS LAST, then flow
/// priority, then input order. Items due within the bypass horizon are
/// `bypassed`; each enforced quota takes what its window has left in one
/// statement and shares it out in that order, each item all or nothing.
#[utoipa::path(
    post, path = "/v1/reserve/batch", tag = "reserve",
    request_body = BatchBody,
    responses(
        (status = 200, description = "One decision per item, in input order", body = BatchDecisions,
         headers(
            ("RateLimit-Policy" = String, description = "One policy per quota the items drew on, in the order first drawn on: \"<quota>\";q=<ceiling>;w=3600, from that quota's tightest item (fewest slots left; the lowest ceiling among its flows' priorities when it decides)"),
            ("RateLimit" = String, description = "For each of those quotas the store counted: \"<quota>\";r=<slots left>;t=<seconds until that changes>, from the same item as its policy (on a deferred item r=0 and t is that item's retry_after_seconds)"),
         )),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than the largest valid batch (500 items, every field at its longest)",
         body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "No item could be decided (the store out of reach, no item due); nothing was granted. Otherwise the answer is 200 and an item the store could not decide says `unavailable`",
         body = Problem, content_type = "application/problem+json",
         // Retry-After: `contract::document_failures`, on every 503.
         headers(
            ("RateLimit-Policy" = String, description = "The policies of the items' quotas the catalog knows, as on a 200 (no RateLimit field: nothing was counted)"),
         )),
    )
)]
pub(crate) async fn reserve_batch(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<BatchBody>,
) -> Result<(HeaderMap, Json<BatchDecisions>), (HeaderMap, ApiError)> {
    if body.items.is_empty() || body.items.len() > MAX_BATCH_ITEMS {
        return Err((
            HeaderMap::new(),
            ApiError::Invalid(format!(
                "`items` must hold between 1 and {MAX_BATCH_ITEMS} items"
            )),
        ));
    }
    let requests = body
        .items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            item.request(&state)
                .map_err(|why| ApiError::Invalid(format!("items[{i}]: {why}")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| (HeaderMap::new(), error))?;
    let decisions = match state
        .reservations
        .decide_batch(&state.bypass, &requests)
        .await
    {
        Ok(decisions) => decisions,
        Err(error) => {
            let flows = requests.iter().map(|r| r.flow.as_str());
            return Err((unanswered_fields(&state, flows), error.into()));
        }
    };
    caller
        .took(&state, decisions.iter().filter_map(|d| d.lease_id))
        .await;
    let mut decisions = decisions;
    let key_id = caller.0.as_ref().and_then(|principal| principal.key_id);
    for (request, decision) in requests.iter().zip(&mut decisions) {
        if request.settle {
            state
                .reservations
                .open_settlement(decision, request, key_id)
                .await;
        }
    }
    let mut headers = HeaderMap::new();
    quota_fields(&mut headers, drawn_on(&decisions));
    let decisions = BatchDecisions {
        decisions: requests
            .into_iter()
            .zip(decisions)
            .map(|(request, decision)| BatchDecision {
                reference: request.reference,
                decision,
            })
            .collect(),
    };
    Ok((headers, Json(decisions)))
}
