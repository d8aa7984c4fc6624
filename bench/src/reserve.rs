//! `POST /v1/reserve` arms: every caller asks for one slot of a flow, again
//! and again; each answer is counted by its outcome and limit.

use std::time::Duration;

use quota_arbiter::decision::{Decision, Limit, Outcome};
use serde::Deserialize;

use crate::drive::{self, Arm};

/// The part of a decision an arm counts.
#[derive(Debug, Deserialize)]
struct Answer {
    outcome: Outcome,
    would_defer: bool,
    limit: Option<Limit>,
}

impl Answer {
    fn label(&self) -> &'static str {
        match (self.outcome, self.limit, self.would_defer) {
            (Outcome::Granted, _, false) => "granted",
            (Outcome::Granted, _, true) => "granted (would defer)",
            (Outcome::Deferred, Some(Limit::Budget), _) => "deferred budget",
            (Outcome::Deferred, Some(Limit::Cadence), _) => "deferred cadence",
            (Outcome::Deferred, Some(Limit::InFlight), _) => "deferred in_flight",
            (Outcome::Deferred, None, _) => "deferred",
            (Outcome::Bypassed, ..) => "bypassed",
            (Outcome::Unthrottled, ..) => "unthrottled",
        }
    }
}

/// One slot of `flow`, as a worker asks before an emission.
pub async fn reserve(client: &reqwest::Client, base: &str, flow: &str) -> anyhow::Result<Decision> {
    Ok(post(client, base, flow).await?.json().await?)
}

async fn post(
    client: &reqwest::Client,
    base: &str,
    flow: &str,
) -> anyhow::Result<reqwest::Response> {
    Ok(client
        .post(format!("{base}/v1/reserve"))
        .json(&serde_json::json!({ "flow": flow }))
        .send()
        .await?
        .error_for_status()?)
}

/// Callers reserving on the flows `pick` names, one call after another.
pub async fn arm(
    name: &str,
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    duration: Duration,
    pick: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> anyhow::Result<Arm> {
    let (client, base) = (client.clone(), base.to_string());
    drive::for_duration(name, concurrency, duration, move |_| {
        let (client, base, flow) = (client.clone(), base.clone(), pick());
        async move {
            let answer: Answer = post(&client, &base, &flow).await?.json().await?;
            Ok(Some(answer.label()))
        }
    })
    .await
}

/// `GET /healthz`: what the HTTP stack alone answers per second, the floor
/// under every other arm.
pub async fn healthz(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Arm> {
    let (client, url) = (client.clone(), format!("{base}/healthz"));
    drive::for_duration(
        "GET /healthz (HTTP floor)",
        concurrency,
        duration,
        move |_| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                client.get(&url).send().await?.error_for_status()?;
                Ok(Some("ok"))
            }
        },
    )
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
