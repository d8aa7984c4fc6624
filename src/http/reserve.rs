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
use crate::domain::decision::{Decision, QuotaLimit, SlotRequest, SlotsLeft, WindowLimit};
use crate::domain::ratelimit_fields;
use crate::domain::Outcome;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReserveBody {
    /// The flow that spends the quota.
    #[schema(schema_with = crate::domain::input::schema::name)]
    pub(crate) flow: String,
    /// Slots to reserve, all or nothing (default 1).
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    pub(crate) count: Option<i64>,
    /// Work due within the bypass horizon (or already past) is granted as `bypassed`.
    #[serde(default, deserialize_with = "super::extract::optional_timestamp")]
    pub(crate) deadline: Option<DateTime<Utc>>,
    /// The caller's reference, echoed in logs.
    #[serde(rename = "ref")]
    #[schema(schema_with = crate::domain::input::schema::optional_reference)]
    pub(crate) reference: Option<String>,
    /// `count` is an estimate: a grant answers a `reservation_id` to settle
    /// it to the actual (`POST /v1/settle`).
    #[serde(default)]
    pub(crate) settle: Option<bool>,
    /// An estimate of what the call spends of the flow's quotas, by quota
    /// name (`{"llm-tokens": 3500}`, up to 10^9 each): reserved like
    /// `count`, and to be settled to the actual. A quota of the flow it
    /// does not name is spent `count`.
    #[serde(
        default,
        deserialize_with = "crate::domain::input::integer::optional_amounts"
    )]
    #[schema(schema_with = crate::domain::input::schema::spend)]
    pub(crate) spend: Option<std::collections::BTreeMap<String, i64>>,
}

impl ReserveBody {
    /// The request this body asks, checked; `spend` names quotas the flow
    /// spends, read from the catalog (an unknown flow's are not checked: it
    /// is never throttled).
    pub(crate) fn request(self, state: &AppState) -> Result<SlotRequest, String> {
        let Some(spend) = self.spend else {
            let mut request =
                SlotRequest::new(self.flow, self.count, self.deadline, self.reference)?;
            request.settle = self.settle.unwrap_or(false);
            return Ok(request);
        };
        if self.settle == Some(false) {
            return Err("`spend` is an estimate to settle: `settle` cannot be false".into());
        }
        check_spend(state, &self.flow, &spend, self.count.is_some())?;
        SlotRequest::estimate(self.flow, self.count, spend, self.deadline, self.reference)
    }
}

/// `spend` as a body gives it (a reservation's, a work item's): 1 to 8
/// quotas, each 1 to 10^9, only quotas the flow spends (read from the
/// catalog; an unknown flow's are not checked: it is never throttled), and
/// `count` (`counted`) only beside a `spend` that leaves one of them unnamed.
pub(crate) fn check_spend(
    state: &AppState,
    flow: &str,
    spend: &std::collections::BTreeMap<String, i64>,
    counted: bool,
) -> Result<(), String> {
    if spend.is_empty() {
        return Err("`spend` names at least one quota the flow spends".into());
    }
    if spend.len() > crate::domain::catalog::MAX_FLOW_QUOTAS {
        return Err(format!(
            "`spend` names at most {} quotas: a flow spends no more",
            crate::domain::catalog::MAX_FLOW_QUOTAS
        ));
    }
    crate::domain::decision::check_amounts(spend)?;
    let rule = state
        .catalog
        .snapshot()
        .and_then(|snapshot| snapshot.rule(flow));
    let Some(rule) = rule else {
        return Ok(());
    };
    let spends = || {
        let names: Vec<String> = rule.quotas().map(|q| format!("`{}`", q.name)).collect();
        names.join(", ")
    };
    if let Some(other) = spend.keys().find(|q| !rule.quotas().any(|r| r.name == **q)) {
        return Err(format!(
            "`spend` names `{other}`, which flow `{}` does not spend (it spends {})",
            rule.flow.name,
            spends()
        ));
    }
    if counted && rule.quotas().all(|q| spend.contains_key(&q.name)) {
        return Err(format!(
            "give `count` or `spend`, not both: `spend` names every quota flow `{}` spends ({})",
            rule.flow.name,
            spends()
        ));
    }
    Ok(())
}

pub(crate) fn router() -> OpenApiRouter<AppState> {
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
pub(crate) async fn reserve(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<ReserveBody>,
) -> Result<(HeaderMap, Json<Decision>), (HeaderMap, ApiError)> {
    let request = body
        .request(&state)
        .map_err(|why| (HeaderMap::new(), ApiError::Invalid(why)))?;
    // Deadline work goes first, down a path that holds no reservation store.
    let decision = match state.bypass.try_bypass(&request) {
        Some(decision) => decision,
        None => match state.reservations.decide(&request).await {
            Ok(decision) => decision,
            Err(error) => {
                let flows = [request.flow.as_str()];
                return Err((unanswered_fields(&state, flows), error.into()));
            }
        },
    };
    caller.took(&state, decision.lease_id).await;
    let mut decision = decision;
    if request.settle {
        let key_id = caller.0.as_ref().and_then(|principal| principal.key_id);
        state
            .reservations
            .open_settlement(&mut decision, &request, key_id)
            .await;
    }
    let mut headers = HeaderMap::new();
    if let Some(seconds) = decision.retry_after_seconds {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    quota_fields(&mut headers, drawn_on(std::slice::from_ref(&decision)));
    Ok((headers, Json(decision)))
}

/// A 503: the store gave no count, so only the policies of the flows'
/// quotas (those the catalog knows); what is left is never guessed.
pub(super) fn unanswered_fields<'a>(
    state: &AppState,
    flows: impl IntoIterator<Item = &'a str>,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let Some(snapshot) = state.catalog.snapshot() else {
        return headers;
    };
    let limits: Vec<(String, QuotaLimit)> = flows
        .into_iter()
        .filter_map(|flow| snapshot.rule(flow))
        .filter_map(|rule| {
            let named = Decision::new(Outcome::Granted, &rule.flow.name)
                .with_ceilings(rule.quotas(), rule.flow.priority);
            Some((rule.quota.name.clone(), named.quota_limit?))
        })
        .collect();
    quota_fields(&mut headers, limits.iter().map(|(q, l)| (q.as_str(), l)));
    headers
}

/// What `decisions` said of their quotas, for [`quota_fields`].
pub(super) fn drawn_on(decisions: &[Decision]) -> impl Iterator<Item = (&str, &QuotaLimit)> {
    decisions
        .iter()
        .filter_map(|d| Some((d.quota.as_deref()?, d.quota_limit.as_ref()?)))
}

/// The RateLimit fields of the quotas drawn on (design.md §4, §12): one
/// policy per window of each quota, in the order first drawn on, each quota
/// from the tightest of what was said of it (the fewest slots left in any
/// window once counted; else the first); in `RateLimit`, per quota, the
/// window with the least left, only when the store counted a decision;
/// never a guess.
pub(super) fn quota_fields<'a>(
    headers: &mut HeaderMap,
    limits: impl IntoIterator<Item = (&'a str, &'a QuotaLimit)>,
) {
    let mut tightest: Vec<(&str, &QuotaLimit)> = Vec::new();
    for (quota, limit) in limits {
        match tightest.iter_mut().find(|(q, _)| *q == quota) {
            Some((_, held)) if tighter(limit, held) => *held = limit,
            Some(_) => {}
            None => tightest.push((quota, limit)),
        }
    }
    let policies = tightest.iter().flat_map(|(_, limit)| {
        limit.windows.iter().map(|window| {
            let ceiling = u64::try_from(window.ceiling).unwrap_or(0);
            ratelimit_fields::policy_field(&window.name, ceiling, window.seconds)
        })
    });
    let lefts = tightest.iter().filter_map(|(_, limit)| {
        let (window, left) = least_left(limit)?;
        Some(ratelimit_fields::limit_field(
            &window.name,
            left.slots,
            Some(left.reset),
        ))
    });
    insert_list(headers, ratelimit_fields::POLICY, policies);
    insert_list(headers, ratelimit_fields::LIMIT, lefts);
}

/// The window with the fewest slots left (of those a count backs); of
/// equals, the one whose count resets last.
fn least_left(limit: &QuotaLimit) -> Option<(&WindowLimit, SlotsLeft)> {
    limit
        .windows
        .iter()
        .filter_map(|w| Some((w, w.left?)))
        .min_by_key(|(_, left)| (left.slots, std::cmp::Reverse(left.reset)))
}

/// Fewer slots left than `held` says; anything counted beats nothing.
fn tighter(limit: &QuotaLimit, held: &QuotaLimit) -> bool {
    match (least_left(limit), least_left(held)) {
        (Some((_, left)), Some((_, held))) => left.slots < held.slots,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// A structured-field list (RFC 8941 §3.1); nothing when it is empty.
fn insert_list(headers: &mut HeaderMap, name: &'static str, items: impl Iterator<Item = String>) {
    let list: Vec<String> = items.collect();
    if !list.is_empty() {
        ratelimit_fields::insert(headers, name, list.join(", "));
    }
}
