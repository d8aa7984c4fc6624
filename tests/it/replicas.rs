//! Black-box: real `quota-arbiter serve` processes sharing one database.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quota_arbiter::domain::decision::{Decision, Outcome};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, database_url, eventually, metrics_text, pin_clock, post_reserve,
    postgres_host_port, Replica,
};

const CALLERS: usize = 64;
pub(crate) const DEMAND: usize = 2000;
const CEILING: i64 = 500;

/// `DEMAND` single-slot requests from `CALLERS` concurrent callers, spread
/// round-robin over the replicas.
pub(crate) async fn hammer(replicas: &[Replica], flow: &str) -> Vec<Decision> {
    let bases: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.base.clone()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (bases, next, client, flow) = (
            bases.clone(),
            next.clone(),
            client.clone(),
            flow.to_string(),
        );
        callers.push(tokio::spawn(async move {
            let mut decisions = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= DEMAND {
                    return decisions;
                }
                // A 503 (the store too slow under this load on a small machine)
                // is no decision: like a worker, ask again.
                let response = loop {
                    let base = &bases[i % bases.len()];
                    let response = post_reserve(&client, base, json!({"flow": flow})).await;
                    if response.status() != 503 {
                        break response;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                assert_eq!(response.status(), 200);
                decisions.push(response.json::<Decision>().await.unwrap());
            }
        }));
    }
    let mut all = Vec::new();
    for caller in callers {
        all.extend(caller.await.unwrap());
    }
    all
}

pub(crate) fn count(decisions: &[Decision], outcome: Outcome) -> usize {
    decisions.iter().filter(|d| d.outcome == outcome).count()
}

pub(crate) async fn three_replicas(pool: &PgPool) -> Vec<Replica> {
    let url = database_url(pool, &postgres_host_port()).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::spawn(&url).await);
    }
    replicas
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn three_replicas_never_over_grant_an_enforced_window(pool: PgPool) {
    // Mid-hour, so the whole run falls in one window.
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", CEILING, "invoice", "enforce").await;
    let replicas = three_replicas(&pool).await;

    let decisions = hammer(&replicas, "invoice").await;

    assert_eq!(decisions.len(), DEMAND);
    assert_eq!(
        count(&decisions, Outcome::Granted),
        CEILING as usize,
        "exactly the ceiling is granted"
    );
    assert_eq!(
        count(&decisions, Outcome::Deferred),
        DEMAND - CEILING as usize
    );
    assert!(decisions.iter().all(|d| !d.would_defer));
    assert_eq!(current_count(&pool, "ppf").await, CEILING);
    let windows: i64 = sqlx::query_scalar("SELECT count(*) FROM quota_window WHERE quota = 'ppf'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(windows, 1);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observe_mode_grants_everything_and_tallies_what_enforcement_would_defer(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", CEILING, "status-report", "observe").await;
    let replicas = three_replicas(&pool).await;

    let decisions = hammer(&replicas, "status-report").await;

    assert_eq!(count(&decisions, Outcome::Granted), DEMAND);
    let over = DEMAND - CEILING as usize;
    // A replica answers an observation before a slow store does (a loaded CI
    // machine): such a grant cannot say yet, and the store error counter has it.
    let answered_early = reserve_store_errors(&replicas).await;
    let would_defer = decisions.iter().filter(|d| d.would_defer).count();
    assert!(
        would_defer <= over && would_defer + answered_early >= over,
        "{would_defer} flagged, {answered_early} answered before the store"
    );
    assert_eq!(
        current_count(&pool, "ppf").await,
        DEMAND as i64,
        "count is the honest record"
    );
    let tallied = eventually(
        Duration::from_secs(10),
        (DEMAND as i64, over as i64),
        || async {
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT coalesce(sum(granted), 0)::bigint, coalesce(sum(would_defer), 0)::bigint
             FROM decision_tally WHERE flow = 'status-report'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        },
    )
    .await;
    assert_eq!(tallied, (DEMAND as i64, over as i64));
}

/// Reservations the replicas gave up waiting for, from their `/metrics`.
async fn reserve_store_errors(replicas: &[Replica]) -> usize {
    let client = reqwest::Client::new();
    let mut total = 0.0;
    for replica in replicas {
        let text = metrics_text(&client, &replica.base).await;
        total += text
            .lines()
            .filter(|l| l.starts_with("quota_arbiter_store_errors_total{operation=\"reserve\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    total as usize
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_restarted_replica_keeps_the_window_and_grants_no_fresh_burst(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let url = database_url(&pool, &postgres_host_port()).await;
    let client = reqwest::Client::new();

    let first = Replica::spawn(&url).await;
    for _ in 0..6 {
        let decision: Decision = post_reserve(&client, &first.base, json!({"flow": "invoice"}))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(decision.outcome, Outcome::Granted);
    }
    first.kill().await;

    let second = Replica::spawn(&url).await;
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        let decision: Decision = post_reserve(&client, &second.base, json!({"flow": "invoice"}))
            .await
            .json()
            .await
            .unwrap();
        outcomes.push(decision.outcome);
    }
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Granted).count(),
        4
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Deferred).count(),
        6
    );
    assert_eq!(current_count(&pool, "ppf").await, 10);
}
