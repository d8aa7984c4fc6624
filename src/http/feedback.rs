//! `POST /v1/report`: what happened upstream after an emission. Frees the
//! grant's concurrency lease and teaches the adaptive cadence; and counts the
//! slots a worker's client spent deciding locally while the arbiter was
//! unreachable (design.md §12).

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::AppState;
use crate::domain::{FlowName, QuotaName};
use crate::store::{LeaseRelease, LeaseScope};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(report_upstream))
}

/// Longest emission a report may describe.
const MAX_DURATION_MS: u64 = 3_600_000;
/// Most degraded slots one report may count (a client sends what it holds in
/// several reports beyond this).
pub(crate) const MAX_DEGRADED: u32 = 1_000_000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FeedbackBody {
    /// The flow that emitted: its quota's cadence adapts. Or name the `quota`.
    #[schema(schema_with = crate::domain::input::schema::optional_name)]
    pub(crate) flow: Option<String>,
    #[schema(schema_with = crate::domain::input::schema::optional_name)]
    pub(crate) quota: Option<String>,
    /// The upstream's HTTP status; 0 when the call timed out.
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    #[schema(minimum = 0, maximum = 599)]
    pub(crate) status: Option<u16>,
    /// How long the emission took; with `lease_id`, this feeds the flow's
    /// average hold time (else the time the lease was held does).
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    #[schema(minimum = 0, maximum = 3600000)]
    pub(crate) duration_ms: Option<u64>,
    /// The lease of the grant, to free its in-flight place: the string the
    /// grant gave (an integer is still read, deprecated).
    #[serde(default, deserialize_with = "crate::domain::input::exact_id::optional")]
    #[schema(schema_with = crate::domain::input::exact_id::optional_input_schema)]
    pub(crate) lease_id: Option<i64>,
    /// Slots the client's local fallback spent (`degraded` decisions) while
    /// the arbiter was unreachable: added to the quota's window the database
    /// clock is in when the report arrives, like count mode's slots.
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    #[schema(minimum = 1, maximum = 1000000)]
    pub(crate) degraded: Option<u32>,
    /// How many of those local decisions were work due within the bypass
    /// horizon, let through at once instead of waiting for the client's
    /// share: tallied as `bypassed` for the reporting flow.
    #[serde(default, deserialize_with = "crate::domain::input::integer::optional")]
    #[schema(minimum = 1, maximum = 1000000)]
    pub(crate) bypassed: Option<u32>,
}

impl FeedbackBody {
    /// Who reports, `flow` or `quota` (one of them), parsed; and the rest
    /// checked in range.
    fn validated(&self) -> Result<Reporter, String> {
        let reporter = match (&self.flow, &self.quota) {
            (Some(flow), None) => FlowName::parse(flow.as_str())
                .map(Reporter::Flow)
                .map_err(|why| format!("`flow` {why}"))?,
            (None, Some(quota)) => QuotaName::parse(quota.as_str())
                .map(Reporter::Quota)
                .map_err(|why| format!("`quota` {why}"))?,
            _ => return Err("give `flow` or `quota` (one of them)".into()),
        };
        if self.status.is_none() && self.lease_id.is_none() && self.degraded.is_none() {
            return Err("give `status`, `lease_id`, `degraded`, or several".into());
        }
        if self
            .degraded
            .is_some_and(|n| !(1..=MAX_DEGRADED).contains(&n))
        {
            return Err(format!("`degraded` must be between 1 and {MAX_DEGRADED}"));
        }
        if let Some(bypassed) = self.bypassed {
            if self.flow.is_none() || self.degraded.is_none() {
                return Err("`bypassed` goes with the `flow` and its `degraded` slots".into());
            }
            if !(1..=MAX_DEGRADED).contains(&bypassed) {
                return Err(format!("`bypassed` must be between 1 and {MAX_DEGRADED}"));
            }
        }
        if self
            .status
            .is_some_and(|s| s != 0 && !(100..=599).contains(&s))
        {
            return Err("`status` must be an HTTP status (100-599), or 0 for a timeout".into());
        }
        if self.duration_ms.is_some_and(|d| d > MAX_DURATION_MS) {
            return Err(format!("`duration_ms` must be at most {MAX_DURATION_MS}"));
        }
        Ok(reporter)
    }
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub(crate) struct FeedbackAnswer {
    /// Whether the lease was still held (an expired one may have been reused).
    pub(crate) released: Option<bool>,
    pub(crate) held_seconds: Option<f64>,
    /// The flow's moving average hold time; leases last twice this, 5-60 s.
    pub(crate) avg_lease_seconds: Option<f64>,
    /// Adaptive factor (0-1] applied to rate and burst, when adapted.
    pub(crate) factor: Option<f64>,
    pub(crate) effective_rate: Option<f64>,
    pub(crate) effective_burst: Option<f64>,
    /// The `degraded` slots counted, once the ledger writes them.
    pub(crate) counted: Option<u32>,
    /// The window they count in; `null`: the one current when they are written.
    pub(crate) counted_in: Option<DateTime<Utc>>,
}

/// Report an emission's upstream outcome, free its lease, and/or count the
/// slots a client decided locally (`degraded`) while the arbiter was unreachable.
#[utoipa::path(post, path = "/v1/report", tag = "reserve", request_body = FeedbackBody,
    responses((status = 200, body = FeedbackAnswer),
        (status = 404, description = "No such flow or quota", body = Problem),
        (status = 409, description = "The lease belongs to another flow or quota", body = Problem),
        (status = 422, body = Problem), (status = 503, body = Problem)))]
pub(crate) async fn report_upstream(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<FeedbackBody>,
) -> Result<Json<FeedbackAnswer>, ApiError> {
    let reporter = body.validated().map_err(ApiError::Invalid)?;
    let quota = reported_quota(&state, &reporter)?;
    let flow = match &reporter {
        Reporter::Flow(flow) => Some(flow.as_str()),
        Reporter::Quota(_) => None,
    };
    let mut answer = FeedbackAnswer::default();
    if let Some(lease_id) = body.lease_id {
        caller.may_release(&state, lease_id).await?;
        let held = body.duration_ms.map(|ms| ms as f64 / 1000.0);
        let holder = LeaseScope {
            flow: flow.map(String::from),
            quota: flow.is_none().then(|| quota.clone()),
        };
        let released = match state
            .reservations
            .release_lease(lease_id, held, &holder)
            .await?
        {
            LeaseRelease::Released(released) => Some(released),
            LeaseRelease::NotHeld => None,
            LeaseRelease::HeldByOther(_) => {
                let reporter = match &reporter {
                    Reporter::Flow(flow) => format!("flow `{flow}`"),
                    Reporter::Quota(quota) => format!("quota `{quota}`"),
                };
                return Err(ApiError::Conflict(format!(
                    "lease {lease_id} is not held by {reporter}; it stays held"
                )));
            }
        };
        answer.released = Some(released.is_some());
        answer.held_seconds = released.as_ref().map(|r| r.held_seconds);
        answer.avg_lease_seconds = released.map(|r| r.avg_seconds);
    }
    if let Some(slots) = body.degraded {
        answer.counted_in = state.reservations.count_local_decisions(
            &quota,
            flow,
            i64::from(slots),
            i64::from(body.bypassed.unwrap_or(0)),
        );
        answer.counted = Some(slots);
    }
    if let Some(status) = body.status {
        if let Some(adapted) = state.reservations.adapt_cadence(&quota, status).await? {
            answer.factor = Some(adapted.factor);
            answer.effective_rate = Some(adapted.effective_rate);
            answer.effective_burst = Some(adapted.effective_burst);
        }
    }
    Ok(Json(answer))
}

/// The quota a report is about: the one named, or the reporting flow's. A
/// name the catalog does not know is a 404, never a silent no-op.
fn reported_quota(state: &AppState, reporter: &Reporter) -> Result<String, ApiError> {
    let snapshot = state.catalog.loaded()?;
    match reporter {
        Reporter::Flow(flow) => snapshot
            .rule(flow)
            .map(|rule| rule.quota.name)
            .ok_or_else(|| ApiError::NotFound(format!("no flow `{flow}`"))),
        Reporter::Quota(quota) if snapshot.has_quota(quota) => Ok(quota.to_string()),
        Reporter::Quota(quota) => Err(ApiError::NotFound(format!("no quota `{quota}`"))),
    }
}

/// Who a report is from: a flow (its quota's cadence, its own leases), or a
/// quota as a whole.
enum Reporter {
    Flow(FlowName),
    Quota(QuotaName),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lasting(duration_ms: u64) -> FeedbackBody {
        FeedbackBody {
            flow: Some("invoice".into()),
            quota: None,
            status: Some(200),
            duration_ms: Some(duration_ms),
            lease_id: None,
            degraded: None,
            bypassed: None,
        }
    }

    #[test]
    fn a_call_may_have_lasted_an_hour_and_no_longer() {
        assert!(lasting(MAX_DURATION_MS).validated().is_ok());
        assert!(lasting(MAX_DURATION_MS + 1).validated().is_err());
    }
}
