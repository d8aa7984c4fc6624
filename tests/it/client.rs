//! The worker client (`quota-arbiter-client`) against real replicas: many
//! tasks acquiring one window, and the local fallback while the arbiter is
//! down, counted by the window once it is back (design.md §12).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use quota_arbiter::domain::catalog::Fallback;
use quota_arbiter::domain::catalog::FlowSeed;
use quota_arbiter_client::{Client, Decision, Reserve, RetryPolicy};
use serde_json::json;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::helpers::{
    create_flow, current_count, database_url, eventually, pin_clock, pin_clock_at,
    postgres_host_port, set_limits, Replica,
};

/// Retries short enough for a test: 2 attempts, 250 ms apart, probes of a
/// fallen arbiter at most a second apart.
fn quick_client(base: &str) -> Client {
    Client::builder()
        .url(base)
        .retry(RetryPolicy {
            attempts: 2,
            base: Duration::from_millis(250),
            max: Duration::from_secs(1),
        })
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn thirty_two_tasks_fill_the_window_then_wait_for_the_next(pool: PgPool) {
    create_flow(&pool, "api", 50, "invoice", "enforce").await;
    // 12 s before the next hour by the database clock (the replica starts in
    // a second or two): the first window fills, the rest waits for the next.
    let pool = pin_clock_at(&pool, 3588.0).await;
    let replica = Replica::spawn(&database_url(&pool, &postgres_host_port()).await).await;
    let client = quick_client(&replica.base);

    let mut tasks = JoinSet::new();
    for _ in 0..32 {
        let client = client.clone();
        tasks.spawn(async move {
            let mut windows = Vec::new();
            for _ in 0..2 {
                let decision = client.acquire(Reserve::new("invoice")).await.unwrap();
                let Decision::Granted { window_start, .. } = decision else {
                    panic!("acquire returns a grant here: {decision:?}");
                };
                windows.push(window_start.expect("a grant names its window"));
            }
            windows
        });
    }
    let mut granted: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
    while let Some(windows) = tasks.join_next().await {
        for window in windows.unwrap() {
            *granted.entry(window).or_default() += 1;
        }
    }
    let counts: Vec<usize> = granted.values().copied().collect();
    assert_eq!(counts, [50, 14], "{granted:?}");
    let (first, next) = (
        granted.keys().next().unwrap(),
        granted.keys().last().unwrap(),
    );
    assert_eq!(*next - *first, chrono::Duration::hours(1));
    // The windows say the same: 50 of 50, then the 14 deferred ones.
    let stored: Vec<i64> = sqlx::query_scalar(
        "SELECT count FROM quota_window WHERE quota = 'api' ORDER BY window_start",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored, [50, 14]);
}

/// Acquires `invoice` for 10 s from the first degraded decision: the
/// decisions within those 10 s, and all it decided locally.
async fn degraded_for_ten_seconds(client: Client) -> (usize, u64) {
    let mut within = 0;
    let mut start = None;
    loop {
        let decision = client.acquire(Reserve::new("invoice")).await;
        let decision = decision.expect("the fallback never refuses");
        assert!(
            matches!(decision, Decision::Degraded { count: 1, .. }),
            "{decision:?}"
        );
        let start = *start.get_or_insert_with(Instant::now);
        if start.elapsed() > Duration::from_secs(10) {
            return (within, client.unreported("invoice"));
        }
        within += 1;
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn clients_of_a_stopped_arbiter_keep_their_share_and_the_window_counts_it(pool: PgPool) {
    create_flow(&pool, "api", 1_000_000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 30, burst = 3").await;
    sqlx::query("UPDATE flow SET fallback = 'local' WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    // Mid-hour: the test never straddles two windows.
    let pool = pin_clock(&pool, 20).await;
    let url = database_url(&pool, &postgres_host_port()).await;
    let replica = Replica::spawn(&url).await;
    let address = replica.base.trim_start_matches("http://").to_string();

    let clients: Vec<Client> = (0..3).map(|_| quick_client(&replica.base)).collect();
    for client in &clients {
        let decision = client.acquire(Reserve::new("invoice")).await.unwrap();
        assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    }
    // Three streams open: each client's share is 10/s, burst 1.
    for client in &clients {
        let share = eventually(Duration::from_secs(10), Some((3, 10.0, 1.0)), || async {
            client
                .share("invoice")
                .map(|s| (s.clients, s.limits.rate, s.limits.burst))
        })
        .await;
        assert_eq!(share, Some((3, 10.0, 1.0)));
    }

    replica.kill().await;
    let mut runs = JoinSet::new();
    for client in &clients {
        runs.spawn(degraded_for_ten_seconds(client.clone()));
    }
    let mut degraded = 0;
    while let Some(run) = runs.join_next().await {
        let (within, decided) = run.unwrap();
        // 10/s × 10 s + the burst of 1; and it kept deciding all along.
        assert!(within <= 101, "{within} decisions in 10 s");
        assert!(within >= 80, "only {within} decisions in 10 s");
        degraded += decided;
    }
    // Work due within the arbiter's bypass horizon (its share event told
    // it) is let through at once, the buckets empty as they are.
    let due = Reserve::new("invoice").deadline(Utc::now() + chrono::Duration::minutes(5));
    for client in &clients {
        let asked = Instant::now();
        for _ in 0..5 {
            let decision = client.acquire(&due).await.unwrap();
            assert!(
                matches!(decision, Decision::Degraded { bypassed: true, .. }),
                "{decision:?}"
            );
        }
        // Waiting for five tokens at 10/s would take 400 ms at least.
        let waited = asked.elapsed();
        assert!(
            waited < Duration::from_millis(250),
            "due work waited {waited:?}"
        );
        degraded += 5;
    }

    // Back, on the same address: the clients hand their slots over.
    let _back = Replica::spawn_with(&url, &[("QUOTA_LISTEN", &address)]).await;
    for client in &clients {
        let left = eventually(Duration::from_secs(20), 0, || async {
            client.unreported("invoice")
        })
        .await;
        assert_eq!(left, 0, "degraded slots still unreported");
    }
    let counted = eventually(Duration::from_secs(5), 3 + degraded as i64, || {
        current_count(&pool, "api")
    })
    .await;
    assert_eq!(
        counted,
        3 + degraded as i64,
        "3 grants + {degraded} degraded"
    );
    let bypasses = eventually(Duration::from_secs(5), Some(15), || async {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT sum(bypassed)::bigint FROM bypasses_by_hour WHERE flow = 'invoice'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(bypasses, Some(15), "the due decisions tallied as bypasses");
}

/// `factor`, set `seconds` ago, as the SQL function recovers it now.
async fn recovered_in_sql(pool: &PgPool, factor: f64, seconds: f64) -> f64 {
    sqlx::query_scalar("SELECT recovered_factor($1, arbiter_now() - make_interval(secs => $2))")
        .bind(factor)
        .bind(seconds)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_arbiter_and_the_client_recover_the_factor_alike(pool: PgPool) {
    // The SQL function the arbiter recovers its adaptive factor with, and
    // the client's, over a few elapsed times.
    for seconds in [0.0, 1.0, 37.5, 120.0, 1000.0] {
        let sql = recovered_in_sql(&pool, 0.3, seconds).await;
        let rust = quota_arbiter_client::recovered_factor(0.3, Duration::from_secs_f64(seconds));
        assert!(
            (sql - rust).abs() < 1e-9,
            "{seconds} s: SQL {sql}, client {rust}"
        );
    }
}

/// The arbiter (its SQL, `upstream_multiplier`) and the worker client's local
/// fallback read an upstream's status alike: every status a report may
/// carry, and the ones it may not.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_arbiter_and_the_client_adapt_to_a_status_alike(pool: PgPool) {
    let arbiter: Vec<(i32, Option<f64>)> = sqlx::query_as(
        "SELECT s, upstream_multiplier(s) FROM generate_series(0, 1000) s ORDER BY s",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(arbiter.len(), 1001);
    for (status, multiplier) in arbiter {
        let status = u16::try_from(status).unwrap();
        assert_eq!(
            multiplier,
            quota_arbiter_client::multiplier(status),
            "status {status}"
        );
    }
}

/// The paced statement recovers the factor of every adaptive bucket it
/// locks: in double precision (numeric exponentiation cost ten times as
/// much), and a factor already back at 1 stays 1 without a power at all.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_factor_recovers_in_double_precision(pool: PgPool) {
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (VERBOSE, COSTS OFF) SELECT recovered_factor(factor, factor_at) FROM quota_bucket",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    let power = plan.split("power(").nth(1).expect("the power, inlined");
    let base = power.split(',').next().unwrap();
    assert!(base.contains("double precision"), "{plan}");
    for (factor, seconds) in [(1.0, 0.0), (1.0, 86_400.0), (2.0, 10.0)] {
        let recovered = recovered_in_sql(&pool, factor, seconds).await;
        assert_eq!(recovered, 1.0, "factor {factor}, {seconds} s ago");
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_config_file_seeds_a_flow_with_its_fallback(pool: PgPool) {
    let mut config = crate::helpers::test_config();
    for (flow, fallback) in [("invoice", Some(Fallback::Local)), ("sync", None)] {
        config.flows.insert(
            flow.into(),
            FlowSeed {
                quota: Some("api".into()),
                quotas: None,
                mode: None,
                priority: None,
                fallback,
            },
        );
    }
    quota_arbiter::store::seed_catalog(
        &pool.clone().into(),
        config.hourly_ceiling,
        &config.quotas,
        &config.flows,
    )
    .await
    .unwrap();
    let stored: Vec<(String, String)> =
        sqlx::query_as("SELECT name, fallback FROM flow ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        stored,
        [
            ("invoice".to_string(), "local".to_string()),
            ("sync".to_string(), "off".to_string())
        ]
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn degraded_slots_reported_count_in_the_current_window(pool: PgPool) {
    create_flow(&pool, "api", 100, "invoice", "enforce").await;
    let pool = pin_clock(&pool, 20).await;
    let app = crate::helpers::TestApp::spawn(pool.clone()).await;
    let answer = app
        .post_json("/v1/report", json!({"flow": "invoice", "degraded": 7}))
        .await;
    assert_eq!(answer["counted"], 7, "{answer}");
    let counted = eventually(Duration::from_secs(5), 7, || current_count(&pool, "api")).await;
    assert_eq!(counted, 7);
    // Due work the fallback let through at once: tallied as bypasses.
    let answer = app
        .post_json(
            "/v1/report",
            json!({"flow": "invoice", "degraded": 3, "bypassed": 2}),
        )
        .await;
    assert_eq!(answer["counted"], 3, "{answer}");
    let bypasses = || async {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT sum(bypassed)::bigint FROM bypasses_by_hour WHERE flow = 'invoice'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(
        eventually(Duration::from_secs(5), Some(2), bypasses).await,
        Some(2)
    );
    assert_eq!(current_count(&pool, "api").await, 10);
    let status = |body: serde_json::Value| {
        let request = app.post("/v1/report");
        async move { request.json(&body).send().await.unwrap().status() }
    };
    for refused in [
        json!({"flow": "invoice", "degraded": 0}),
        json!({"flow": "invoice", "degraded": -3}),
        json!({"flow": "invoice", "degraded": 1_000_001}),
        json!({"flow": "invoice", "bypassed": 1}),
        json!({"quota": "api", "degraded": 2, "bypassed": 1}),
        json!({"flow": "invoice", "degraded": 2, "bypassed": 0}),
    ] {
        assert_eq!(status(refused.clone()).await, 422, "{refused}");
    }
    let unknown = json!({"flow": "nobody", "degraded": 3});
    assert_eq!(status(unknown).await, 404);
    assert_eq!(current_count(&pool, "api").await, 10);
}

/// An LLM worker's cycle, a cost known after the call: acquire the prompt's
/// tokens plus `max_tokens` and a request, emit, settle the tokens billed;
/// the windows count the actual, the request as estimated.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_worker_acquires_an_estimate_and_settles_what_was_billed(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "llm-tokens", 10_000, "chat", "enforce").await;
    sqlx::raw_sql(
        "INSERT INTO quota (name, hourly_ceiling) VALUES ('llm-requests', 100);
         UPDATE flow SET quota = 'llm-requests', further_quotas = '{llm-tokens}' WHERE name = 'chat';",
    )
    .execute(&pool)
    .await
    .unwrap();
    let replica = Replica::spawn(&database_url(&pool, &postgres_host_port()).await).await;
    let client = quick_client(&replica.base);
    let (prompt_tokens, max_tokens) = (1500, 2000);
    let decision = client
        .acquire(Reserve::new("chat").spend("llm-tokens", prompt_tokens + max_tokens))
        .await
        .unwrap();
    assert_eq!(current_count(&pool, "llm-tokens").await, 3500);
    assert_eq!(current_count(&pool, "llm-requests").await, 1);
    let id = decision
        .reservation_id()
        .expect("an estimate to settle")
        .clone();
    // The provider billed 2310 tokens (`usage.total_tokens`).
    let settled = client.settle(&id, "llm-tokens", 2310).await.unwrap();
    let tokens = settled.of("llm-tokens").expect("the tokens settled");
    assert_eq!((tokens.given_back, tokens.overspent), (1190, 0));
    assert_eq!(
        (settled.quota.as_str(), settled.spent),
        ("llm-requests", 1),
        "the request as estimated"
    );
    assert_eq!(current_count(&pool, "llm-tokens").await, 2310);
    assert_eq!(current_count(&pool, "llm-requests").await, 1);
    assert!(client.settle(&id, "llm-tokens", 1).await.is_err(), "once");
}
