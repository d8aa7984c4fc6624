//! SIGTERM loses nothing: counts and tallies made after the fact (count mode,
//! deadline bypass, observations the store answered too late) that are still
//! in memory, in a flush the store is holding up, or still to come, are
//! written before a real server process exits.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, database_url, eventually, lock_window, pin_clock, post_reserve,
    postgres_host_port, Replica,
};

const BURST: usize = 150;

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn sigterm_writes_every_count_and_tally_made_after_the_fact(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1000, "status-report", "count").await;
    create_flow(&pool, "ppf", 1000, "invoice", "enforce").await;
    let mut replica = Replica::spawn(&database_url(&pool, &postgres_host_port()).await).await;
    let client = reqwest::Client::new();
    let first = post_reserve(&client, &replica.base, json!({"flow": "status-report"})).await;
    assert_eq!(first.status(), 200);
    let flushed = eventually(Duration::from_secs(5), 1, || current_count(&pool, "ppf")).await;
    assert_eq!(flushed, 1, "the window row exists");

    // Hold the window row: the next flush takes its batch out of memory and
    // waits on the row, mid-transaction, when the signal comes.
    let held = lock_window(&pool, "ppf").await;
    burst(&client, &replica.base).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(replica.is_running());
    replica.terminate();
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.commit().await.unwrap();
    let status = replica.exited(Duration::from_secs(20)).await;
    assert!(status.success(), "a graceful exit: {status}");

    assert_eq!(
        current_count(&pool, "ppf").await,
        1 + 2 * BURST as i64,
        "every slot spent after the fact is in the window"
    );
    let tallied: (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(unthrottled) FILTER (WHERE flow = 'status-report'), 0)::bigint,
                coalesce(sum(bypassed) FILTER (WHERE flow = 'invoice'), 0)::bigint
         FROM decision_tally WHERE quota = 'ppf'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        tallied,
        (1 + BURST as i64, BURST as i64),
        "every decision tallied"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn sigterm_waits_for_an_observation_answered_late_and_counts_it(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1000, "status-report", "observe").await;
    let url = database_url(&pool, &postgres_host_port()).await;
    let mut replica = Replica::spawn_with(&url, &[("QUOTA_STORE_TIMEOUT", "300ms")]).await;
    let client = reqwest::Client::new();
    let observe = || post_reserve(&client, &replica.base, json!({"flow": "status-report"}));
    assert_eq!(observe().await.status(), 200);
    assert_eq!(current_count(&pool, "ppf").await, 1);

    // Answered before the store, its statement still waiting on the row when
    // the signal comes; then it fails, so only the replica can count it.
    let held = lock_window(&pool, "ppf").await;
    assert_eq!(observe().await.status(), 200);
    replica.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(terminated, 1, "the late observation was still waiting");
    held.commit().await.unwrap();
    let status = replica.exited(Duration::from_secs(20)).await;
    assert!(status.success(), "a graceful exit: {status}");

    assert_eq!(
        current_count(&pool, "ppf").await,
        2,
        "the late observation is counted after the fact"
    );
}

/// `BURST` count-mode decisions and `BURST` deadline bypasses, concurrently.
async fn burst(client: &reqwest::Client, base: &str) {
    // Due within the bypass horizon by any clock: already past.
    let deadline = (Utc::now() - chrono::Duration::hours(2)).to_rfc3339();
    let mut calls = Vec::new();
    for i in 0..2 * BURST {
        let body = if i % 2 == 0 {
            json!({"flow": "status-report"})
        } else {
            json!({"flow": "invoice", "deadline": deadline})
        };
        let (client, base) = (client.clone(), base.to_string());
        calls.push(tokio::spawn(async move {
            let response = post_reserve(&client, &base, body).await;
            assert_eq!(response.status(), 200);
            let decision: serde_json::Value = response.json().await.unwrap();
            let want = if i % 2 == 0 {
                "unthrottled"
            } else {
                "bypassed"
            };
            assert_eq!(decision["outcome"], want);
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
}

/// A share stream never ends by itself, and a graceful shutdown waits for
/// every connection: the replica ends its streams when it stops, so SIGTERM
/// with a worker following its share still exits at once (not after the
/// client hangs up, or a supervisor's SIGKILL).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn sigterm_ends_open_share_streams_and_exits(pool: PgPool) {
    create_flow(&pool, "ppf", 1000, "invoice", "observe").await;
    let mut replica = Replica::spawn(&database_url(&pool, &postgres_host_port()).await).await;
    let mut stream = reqwest::Client::new()
        .get(format!("{}/v1/stream?flow=invoice", replica.base))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
        .await
        .expect("the first share event")
        .unwrap();
    assert!(first.is_some(), "the stream is open");

    let asked = std::time::Instant::now();
    replica.terminate();
    let status = replica.exited(Duration::from_secs(20)).await;
    assert!(status.success(), "a graceful exit: {status}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "stopped in {:?} with a stream open",
        asked.elapsed()
    );
    // The stream ended with the replica, cleanly or cut.
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(rest.is_ok(), "the stream ends");
}
