//! The claim path of the pending-work registry: enqueue N items over HTTP,
//! then `concurrency` workers claim them one at a time until the queue is
//! drained (or the arm's duration is up). Claims per second count leased
//! items only; the claims that found nothing end the worker's run.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{drive_calls, pgbench, ArmResult, BENCH_ACTOR, UNREACHABLE_CEILING};
use crate::arbiter::{Claim, ClaimOutcome};
use crate::config::Config;
use crate::store::Store;

pub(super) async fn run(
    client: &reqwest::Client,
    base: &str,
    flow: &str,
    items: usize,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Vec<ArmResult>> {
    let enqueue = drive_calls("HTTP POST /v1/work (enqueue)", concurrency, items, {
        let (client, url, flow) = (client.clone(), format!("{base}/v1/work"), flow.to_string());
        move |n| {
            let (client, url, flow) = (client.clone(), url.clone(), flow.clone());
            async move {
                let body = json!({"flow": flow, "payload": {"n": n}, "ref": format!("{flow}-{n}")});
                client
                    .post(&url)
                    .json(&body)
                    .send()
                    .await?
                    .error_for_status()?;
                anyhow::Ok(true)
            }
        }
    });
    let mut arms = vec![enqueue.await?];
    let until = Instant::now() + duration;
    let unavailable = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let claims = drive_calls(
        "HTTP POST /v1/work/claim (max 1)",
        concurrency,
        usize::MAX,
        {
            let (client, url) = (client.clone(), format!("{base}/v1/work/claim"));
            let unavailable = unavailable.clone();
            move |n| {
                let (client, url, unavailable) = (client.clone(), url.clone(), unavailable.clone());
                async move {
                    if Instant::now() >= until {
                        return Ok(false);
                    }
                    let body = json!({"worker": format!("bench-{}", n % 1024), "max": 1});
                    // A 503 (claims of one quota queue on its window row) is retried,
                    // as a worker would; the latency includes the retries.
                    let response = loop {
                        let response = client.post(&url).json(&body).send().await?;
                        if response.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                            break response;
                        }
                        unavailable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    };
                    let claim: Claim = response.error_for_status()?.json().await?;
                    Ok(claim.outcome == ClaimOutcome::Claimed)
                }
            }
        },
    );
    arms.push(claims.await?);
    let retried = unavailable.load(std::sync::atomic::Ordering::Relaxed);
    if retried > 0 {
        println!("({retried} claims answered 503 store-unavailable and were retried)");
    }
    Ok(arms)
}

/// The transaction a claim of one item runs on one enforced quota (first
/// look, take, lock the most urgent item, lease it), replayed by pgbench with
/// the server's own statements on a queue of its own.
pub(super) async fn pgbench_baseline(
    config: &Config,
    store: &Store,
    tag: &str,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<ArmResult> {
    let quota = format!("{tag}-pgclaim");
    let sized = crate::catalog::QuotaSettings::sized(UNREACHABLE_CEILING);
    store.put_quota(BENCH_ACTOR, &quota, &sized).await?;
    // More than pgbench can claim in the run: a client that found the queue
    // empty would stop with an error.
    let items = 2000 * duration.as_secs().max(1) as i32 + 1000;
    sqlx::query_file!("sql/bench_fill_queue.sql", quota, items)
        .execute(store.pool())
        .await?;
    let (flows, ceiling) = (format!("ARRAY['{quota}']"), UNREACHABLE_CEILING.to_string());
    let (name, horizon) = (format!("'{quota}'"), "900");
    let sql = pgbench::with_literals;
    let script = [
        "BEGIN;".to_string(),
        sql(
            include_str!("../../sql/work_first_look.sql"),
            &["NULL", horizon, "1", &flows, &flows],
        ) + ";",
        sql(
            include_str!("../../sql/take_slots.sql"),
            &[&name, "1", &ceiling],
        ) + ";",
        sql(
            include_str!("../../sql/work_candidates.sql"),
            &[&flows, "NULL", horizon, "1"],
        ) + " \\gset",
        sql(
            include_str!("../../sql/work_claim.sql"),
            &[
                "ARRAY[:id]",
                "'pgbench'",
                "300",
                "ARRAY['granted']",
                "ARRAY[NULL::bigint]",
            ],
        ) + ";",
        "COMMIT;\n".to_string(),
    ]
    .join("\n");
    let name = "same claim transaction via pgbench";
    pgbench::run(config, name, &script, concurrency, duration).await
}
