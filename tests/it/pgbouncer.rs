//! The service behind a real PgBouncer (design.md §13), as many deployments
//! run PostgreSQL: in session pooling, and in transaction pooling with and
//! without a direct URL for what needs a session (migrations, LISTEN).
//! Every path works; flips are obeyed. Skipped, with a message, where
//! PgBouncer is not installed (`.ci/run` installs Debian's).

use std::time::Duration;

use quota_arbiter::domain::decision::{Decision, Outcome};
use quota_arbiter::domain::PoolMode;
use reqwest::Method;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::helpers::{
    current_count, database_url, eventually, pin_clock, post_reserve, postgres_host_port, Replica,
    TestApp, ADMIN_TOKEN,
};
use crate::replicas::{count, hammer};
use pooler::Pooler;

/// The bench's PgBouncer of its own, started here for each test.
#[path = "../../bench/src/pooler.rs"]
mod pooler;

/// A pool of `connections` through `pooler`.
async fn pool_through(pooler: &Pooler, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect(pooler.url())
        .await
        .expect("pgbouncer accepts connections")
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn behind_pgbouncer_in_session_pooling_every_path_works(pool: PgPool) {
    let Some(pgbouncer) = pooler::program(None) else {
        eprintln!("SKIPPED behind_pgbouncer: no pgbouncer (.ci/run installs Debian's)");
        return;
    };
    let direct = database_url(&pool, &postgres_host_port()).await;

    // Session pooling: every path, the listener's flips included.
    let session = Pooler::start(&pgbouncer, &direct, PoolMode::Session, 20)
        .await
        .expect("pgbouncer starts");
    let app = TestApp::spawn(pool_through(&session, 8).await).await;
    let ready = || async { app.get("/readyz").send().await.unwrap().status().as_u16() };
    assert_eq!(eventually(Duration::from_secs(5), 200, ready).await, 200);
    app.admin_json(
        Method::PUT,
        "/v1/quotas/ppf",
        Some(json!({"hourly_ceiling": 2})),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/invoice",
        Some(json!({"quota": "ppf", "mode": "enforce"})),
    )
    .await;
    let outcomes = [
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        app.reserve(json!({"flow": "invoice"})).await.outcome,
    ];
    assert_eq!(
        outcomes,
        [Outcome::Granted, Outcome::Granted, Outcome::Deferred]
    );
    // A flip made in SQL, straight on the database: the listener hears it.
    sqlx::query("UPDATE flow SET mode = 'observe' WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    let observed = eventually(Duration::from_secs(3), true, || async {
        app.reserve(json!({"flow": "invoice"})).await.would_defer
    })
    .await;
    assert!(observed, "the flip to observe is obeyed");
    enqueue_and_claim(&app.client, (&app.base, &app.base), "invoice").await;
}

/// A work item of `flow` enqueued through one replica and claimed through
/// the other (the claim's transaction begins with settings of its own).
async fn enqueue_and_claim(client: &reqwest::Client, (enqueue, claim): (&str, &str), flow: &str) {
    let enqueued = client
        .post(format!("{enqueue}/v1/work"))
        .json(&json!({"flow": flow, "ref": "w-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(enqueued.status(), 201, "{}", enqueued.text().await.unwrap());
    let claimed: serde_json::Value = client
        .post(format!("{claim}/v1/work/claim"))
        .json(&json!({"worker": "w"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(claimed["outcome"], "claimed", "{claimed}");
}

/// Transaction pooling, as PgBouncer is most often run: 4 server connections
/// shared by two replicas' 32 client connections. One replica names
/// PostgreSQL itself for migrations and LISTEN (`QUOTA_DIRECT_DATABASE_URL`);
/// the other has only the pooler and polls the catalog.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn behind_pgbouncer_in_transaction_pooling_every_path_works(pool: PgPool) {
    let Some(pgbouncer) = pooler::program(None) else {
        eprintln!("SKIPPED behind_pgbouncer: no pgbouncer (.ci/run installs Debian's)");
        return;
    };
    let pool = pin_clock(&pool, 10).await;
    let direct = database_url(&pool, &postgres_host_port()).await;
    let bouncer = Pooler::start(&pgbouncer, &direct, PoolMode::Transaction, 4)
        .await
        .expect("pgbouncer starts");
    let pooled = bouncer.url();
    let transaction = ("QUOTA_DATABASE_POOL_MODE", "transaction");
    // Migrates on start, through the direct URL, and listens there.
    let listening = Replica::spawn_with(
        pooled,
        &[transaction, ("QUOTA_DIRECT_DATABASE_URL", direct.as_str())],
    )
    .await;
    // Only the pooler: no migrations, the catalog polled.
    let polling =
        Replica::spawn_with(pooled, &[transaction, ("QUOTA_MIGRATE_ON_START", "false")]).await;
    let client = reqwest::Client::new();
    for replica in [&listening, &polling] {
        let ready = || async {
            let response = client.get(format!("{}/readyz", replica.base)).send().await;
            response.map_or(0, |r| r.status().as_u16())
        };
        assert_eq!(eventually(Duration::from_secs(10), 200, ready).await, 200);
    }

    // Admin writes, through each replica.
    for (replica, quota, flow) in [(&listening, "ppf", "invoice"), (&polling, "sms", "alert")] {
        let put = |path: String, body: serde_json::Value| {
            client
                .put(format!("{}{path}", replica.base))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body)
                .send()
        };
        let written = put(
            format!("/v1/quotas/{quota}"),
            json!({"hourly_ceiling": 300}),
        )
        .await
        .unwrap();
        assert_eq!(written.status(), 200, "{}", written.text().await.unwrap());
        let written = put(
            format!("/v1/flows/{flow}"),
            json!({"quota": quota, "mode": "enforce"}),
        )
        .await
        .unwrap();
        assert_eq!(written.status(), 200, "{}", written.text().await.unwrap());
    }
    let replicas = [listening, polling];
    // Both replicas know both flows (one was written through the other).
    for replica in &replicas {
        let known = || async {
            let reserved = post_reserve(&client, &replica.base, json!({"flow": "alert"})).await;
            reserved.json::<Decision>().await.unwrap().outcome
        };
        let outcome = eventually(Duration::from_secs(3), Outcome::Granted, known).await;
        assert_eq!(outcome, Outcome::Granted);
    }

    // Exact grants: many callers over both replicas, each statement on
    // whichever server connection the pooler hands out.
    let decisions = hammer(&replicas, "invoice").await;
    assert_eq!(count(&decisions, Outcome::Granted), 300);
    assert_eq!(current_count(&pool, "ppf").await, 300);

    // A reservation of an estimate, settled (a transaction of its own).
    let reserved: serde_json::Value = post_reserve(
        &client,
        &replicas[1].base,
        json!({"flow": "alert", "spend": {"sms": 5}}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(reserved["outcome"], "granted", "{reserved}");
    let settled = client
        .post(format!("{}/v1/settle", replicas[0].base))
        .json(&json!({"reservation_id": reserved["reservation_id"], "spent": {"sms": 2}}))
        .send()
        .await
        .unwrap();
    assert_eq!(settled.status(), 200, "{}", settled.text().await.unwrap());
    // 1 reserved per replica by the probes above, then 2 settled.
    assert_eq!(current_count(&pool, "sms").await, 4);

    let bases = (replicas[0].base.as_str(), replicas[1].base.as_str());
    enqueue_and_claim(&client, bases, "alert").await;

    // A flip made in SQL on PostgreSQL: heard by the listener, found by the
    // poll, each within about a second.
    sqlx::query("UPDATE flow SET mode = 'observe' WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    for replica in &replicas {
        let flipped = tokio::time::Instant::now();
        let observed = eventually(Duration::from_secs(3), true, || async {
            let reserved = post_reserve(&client, &replica.base, json!({"flow": "invoice"})).await;
            reserved.json::<Decision>().await.unwrap().would_defer
        })
        .await;
        assert!(observed, "the flip to observe is obeyed");
        assert!(
            flipped.elapsed() < Duration::from_millis(1500),
            "{:?}",
            flipped.elapsed()
        );
    }
    // Not one statement failed on the way (a statement kept past its
    // transaction would have: `prepared statement "sqlx_s_1" already exists`).
    for replica in &replicas {
        let failures: Vec<String> = replica
            .log_lines()
            .into_iter()
            .filter(|line| line.contains("\"ERROR\"") || line.contains("prepared statement"))
            .collect();
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
