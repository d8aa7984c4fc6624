//! `POST /v1/reserve` arms: every caller asks for one slot of a flow, again
//! and again; each answer is counted by its outcome and limit. And the HTTP
//! floor under them.

use chrono::{DateTime, Utc};
use quota_arbiter::domain::decision::{Limit, Outcome};
use serde::Deserialize;

use crate::drive::{Arm, Load, Stop};
use crate::http::Client;

/// The part of a decision the bench reads.
#[derive(Debug, Deserialize)]
pub struct Answer {
    pub outcome: Outcome,
    would_defer: bool,
    limit: Option<Limit>,
    pub retry_at: Option<DateTime<Utc>>,
    /// A grant's in-flight place (a string of digits).
    #[serde(default)]
    pub lease_id: Option<String>,
}

impl Answer {
    /// What an arm counts this answer as.
    pub fn label(&self) -> &'static str {
        match (self.outcome, self.limit, self.would_defer) {
            (Outcome::Granted, _, false) => "granted",
            (Outcome::Granted, _, true) => "granted (would defer)",
            (Outcome::Deferred, Some(Limit::Budget), _) => "deferred budget",
            (Outcome::Deferred, Some(Limit::Cadence), _) => "deferred cadence",
            (Outcome::Deferred, Some(Limit::InFlight), _) => "deferred in_flight",
            (Outcome::Deferred, None, _) => "deferred",
            (Outcome::Bypassed, ..) => "bypassed",
            (Outcome::Unthrottled, ..) => "unthrottled",
            (Outcome::Unavailable, ..) => "unavailable",
        }
    }
}

/// One slot of `flow`, as a worker asks before an emission, on `caller`'s
/// connection.
pub async fn reserve(client: &Client, caller: usize, flow: &str) -> anyhow::Result<Answer> {
    let body = serde_json::json!({ "flow": flow });
    client.post_json(caller, "/v1/reserve", &body).await?.json()
}

/// Callers reserving on the flows `pick` names until `stop`, each answer
/// counted by its outcome and limit.
pub async fn arm(
    load: &Load,
    name: &str,
    stop: Stop,
    pick: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> anyhow::Result<Arm> {
    let client = load.client.clone();
    load.drive(name, stop, move |call| {
        let (client, flow) = (client.clone(), pick());
        async move { Ok(Some(reserve(&client, call.caller, &flow).await?.label())) }
    })
    .await
}

/// What a worker does after its reservation, in a whole-cycle arm.
#[derive(Clone, Copy, Debug)]
pub enum AfterReserving {
    /// Holds the grant's place for this long (the emission), then releases
    /// it (`POST /v1/report` with the `lease_id`); a deferral releases
    /// nothing.
    Release(std::time::Duration),
    /// Reports this upstream status for the flow (`POST /v1/report`),
    /// granted or not: an upstream storm.
    Report(u16),
}

/// Whole worker cycles on `flow`: reserve, then `after`. Each cycle is one
/// answer, counted by its reservation's outcome.
pub async fn cycle_arm(
    load: &Load,
    name: &str,
    flow: &str,
    after: AfterReserving,
) -> anyhow::Result<Arm> {
    let client = load.client.clone();
    let flow = flow.to_string();
    load.drive(name, Stop::Elapsed, move |call| {
        let (client, flow) = (client.clone(), flow.clone());
        async move {
            let answer = reserve(&client, call.caller, &flow).await?;
            let report = match (after, &answer.lease_id) {
                (AfterReserving::Release(hold), Some(lease_id)) => {
                    tokio::time::sleep(hold).await;
                    Some(serde_json::json!({ "flow": flow, "lease_id": lease_id }))
                }
                (AfterReserving::Release(_), None) => None,
                (AfterReserving::Report(status), _) => {
                    Some(serde_json::json!({ "flow": flow, "status": status }))
                }
            };
            if let Some(body) = report {
                let reported = client.post_json(call.caller, "/v1/report", &body).await?;
                reported.success()?;
            }
            Ok(Some(answer.label()))
        }
    })
    .await
}

#[derive(Deserialize)]
struct BatchAnswer {
    decisions: Vec<Answer>,
}

/// Callers posting batches of `items` single-slot items of `flow` to
/// `POST /v1/reserve/batch` until the arm's time is up: one answer per
/// batch, counted as `granted` when every item was granted, else by the
/// label of its first item that was not.
pub async fn batch_arm(load: &Load, name: &str, flow: &str, items: usize) -> anyhow::Result<Arm> {
    let item = serde_json::json!({ "flow": flow });
    let body = serde_json::json!({ "items": vec![item; items] });
    let client = load.client.clone();
    load.drive(name, Stop::Elapsed, move |call| {
        let (client, body) = (client.clone(), body.clone());
        async move {
            let response = client.post_json(call.caller, "/v1/reserve/batch", &body);
            let answer: BatchAnswer = response.await?.json()?;
            anyhow::ensure!(answer.decisions.len() == items, "a decision per item");
            let mut labels = answer.decisions.iter().map(Answer::label);
            Ok(Some(labels.find(|l| *l != "granted").unwrap_or("granted")))
        }
    })
    .await
}

/// `GET /healthz`: what the HTTP stack alone answers per second, the floor
/// under every other arm.
pub async fn healthz(load: &Load) -> anyhow::Result<Arm> {
    let client = load.client.clone();
    load.drive("GET /healthz (HTTP floor)", Stop::Elapsed, move |call| {
        let client = client.clone();
        async move {
            let status = client.get(call.caller, "/healthz", &[]).await?.status;
            anyhow::ensure!(status == 200, "GET /healthz: HTTP {status}");
            Ok(Some("ok"))
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::Answer;

    fn label(json: &str) -> &'static str {
        serde_json::from_str::<Answer>(json).unwrap().label()
    }

    #[test]
    fn answers_are_counted_by_outcome_and_limit() {
        let granted = r#"{"outcome":"granted","flow":"f","would_defer":false,"limit":null}"#;
        assert_eq!(label(granted), "granted");
        let observed = r#"{"outcome":"granted","would_defer":true,"limit":"budget"}"#;
        assert_eq!(label(observed), "granted (would defer)");
        let held = r#"{"outcome":"deferred","would_defer":false,"limit":"in_flight"}"#;
        assert_eq!(label(held), "deferred in_flight");
    }
}
