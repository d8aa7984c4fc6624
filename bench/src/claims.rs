//! The pending-work registry: callers enqueue items over HTTP for the arm's
//! duration, then workers claim them one at a time (`max` = 1) for the same
//! duration; beside it, the claim transaction replayed by pgbench.

use std::time::Duration;

use quota_arbiter::store::Store;
use serde::Deserialize;
use serde_json::json;

use crate::drive::{Arm, Load, Stop};
use crate::pgbench::{text_literal, with_literals, Pgbench};
use crate::setup::UNREACHABLE_CEILING;

/// How long a worker waits before asking again after a 503.
const RETRY_AFTER_UNAVAILABLE: Duration = Duration::from_millis(50);

/// Claims pgbench makes per second at most, by a wide margin: its queue must
/// not run dry (a client that finds it empty stops with an error).
const RAW_CLAIMS_PER_SECOND_AT_MOST: i32 = 5000;

#[derive(Deserialize)]
struct ClaimAnswer {
    outcome: String,
    #[serde(default)]
    items: Vec<ClaimedItem>,
}

#[derive(Deserialize)]
struct ClaimedItem {
    item: ItemId,
}

#[derive(Deserialize)]
struct ItemId {
    id: i64,
}

/// `POST /v1/work` on `flow` for the arm's duration.
pub async fn enqueue(load: &Load, flow: &str) -> anyhow::Result<Arm> {
    let (client, flow) = (load.client.clone(), flow.to_string());
    load.drive("POST /v1/work (enqueue)", Stop::Elapsed, move |call| {
        let (client, flow) = (client.clone(), flow.clone());
        async move {
            let n = call.n;
            let body = json!({"flow": flow, "payload": {"n": n}, "ref": format!("{flow}-{n}")});
            let response = client.post_json(call.caller, "/v1/work", &body).await?;
            response.success()?;
            Ok(Some("enqueued"))
        }
    })
    .await
}

/// `POST /v1/work/claim` of one item of `flow` at a time, until the arm's
/// duration is up or the queue is drained. A 503 (the claim waited past the
/// store timeout) is asked again, as a worker would; its latency includes the
/// retries and it is counted apart.
pub async fn claim(load: &Load, flow: &str) -> anyhow::Result<Arm> {
    let (client, flow) = (load.client.clone(), flow.to_string());
    load.drive("claims, max 1", Stop::Elapsed, move |call| {
        let client = client.clone();
        let body = json!({"worker": format!("bench-{}", call.caller), "flows": [flow], "max": 1});
        async move {
            let mut unavailable = false;
            let response = loop {
                let response = client
                    .post_json(call.caller, "/v1/work/claim", &body)
                    .await?;
                if response.status != 503 {
                    break response;
                }
                unavailable = true;
                tokio::time::sleep(RETRY_AFTER_UNAVAILABLE).await;
            };
            let answer: ClaimAnswer = response.json()?;
            Ok(match (answer.outcome.as_str(), unavailable) {
                ("empty", _) => None,
                ("claimed", false) => Some("claimed"),
                ("claimed", true) => Some("claimed after a 503"),
                _ => Some("deferred"),
            })
        }
    })
    .await
}

/// Whole worker cycles on `flow`'s queue, one item at a time per caller:
/// enqueue an item, claim one (`max` = 1; a 503 is asked again), mark it
/// done. Each cycle is one answer, counted by its claim's outcome.
pub async fn claim_done_cycles(load: &Load, flow: &str) -> anyhow::Result<Arm> {
    let (client, flow) = (load.client.clone(), flow.to_string());
    load.drive("enqueue, claim, done", Stop::Elapsed, move |call| {
        let (client, flow) = (client.clone(), flow.clone());
        async move {
            let worker = format!("cycle-{}", call.caller);
            let item = json!({"flow": flow, "payload": {"n": call.n}});
            client
                .post_json(call.caller, "/v1/work", &item)
                .await?
                .success()?;
            let claim = json!({"worker": worker, "flows": [flow], "max": 1});
            let response = loop {
                let response = client
                    .post_json(call.caller, "/v1/work/claim", &claim)
                    .await?;
                if response.status != 503 {
                    break response;
                }
                tokio::time::sleep(RETRY_AFTER_UNAVAILABLE).await;
            };
            let answer: ClaimAnswer = response.json()?;
            let Some(claimed) = answer.items.first() else {
                return Ok(Some(if answer.outcome == "empty" {
                    "empty"
                } else {
                    "deferred"
                }));
            };
            let done = format!("/v1/work/{}/done", claimed.item.id);
            let body = json!({"worker": worker});
            client
                .post_json(call.caller, &done, &body)
                .await?
                .success()?;
            Ok(Some("done"))
        }
    })
    .await
}

/// The transaction a claim of one item of one flow runs on its enforced quota
/// (first look, take, lock the most urgent item, lease it), as the claim arm
/// asks it, replayed by pgbench with the service's own statements on a queue
/// of its own (flow `quota`).
pub async fn raw_claim_baseline(
    pgbench: &Pgbench,
    store: &Store,
    quota: &str,
) -> anyhow::Result<Arm> {
    let items = RAW_CLAIMS_PER_SECOND_AT_MOST * pgbench.duration.as_secs().max(1) as i32;
    sqlx::query_file!("sql/fill_queue.sql", quota, items)
        .execute(store.pool())
        .await?;
    let (name, flows) = (
        text_literal(quota),
        format!("ARRAY[{}]", text_literal(quota)),
    );
    let (ceiling, horizon) = (UNREACHABLE_CEILING.to_string(), "900");
    let script = [
        "BEGIN;".to_string(),
        with_literals(
            include_str!("../../sql/work_first_look.sql"),
            &[&flows, horizon, "1", &flows],
        ) + ";",
        with_literals(
            include_str!("../../sql/take_windows.sql"),
            &[
                &format!("ARRAY[{name}]"),
                "ARRAY[1]",
                "ARRAY[1]",
                "ARRAY[1]",
                "ARRAY['1h']",
                "ARRAY[NULL::text]",
                &format!("ARRAY[{ceiling}]"),
                "false",
            ],
        ) + ";",
        with_literals(
            include_str!("../../sql/work_candidates.sql"),
            // Items without a `spend`: a lane's walk, as a claim's.
            &[&flows, &flows, horizon, "1", "true"],
        ) + " \\gset",
        with_literals(
            include_str!("../../sql/work_claim.sql"),
            &[
                "ARRAY[:id]",
                "ARRAY['pgbench']",
                "ARRAY[300]",
                "ARRAY['granted']",
                "ARRAY[NULL::bigint]",
            ],
        ) + ";",
        "COMMIT;\n".to_string(),
    ]
    .join("\n");
    pgbench.run("claim transaction (pgbench)", &script).await
}
