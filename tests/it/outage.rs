//! The store goes away: enforced flows fail closed within 2 s; observe, count,
//! unknown and bypass keep answering 200; everything recovers by itself.

use std::time::{Duration, Instant};

use chrono::Utc;
use quota_arbiter::domain::decision::{Decision, Outcome};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    batch_outcomes, behind_a_proxy, create_flow, current_count, db_now, eventually,
    hold_time_samples, lock_window, metrics_text, pin_clock, post_batch, problem_slug, set_limits,
    test_config, Replica, TestApp,
};
use crate::metrics::sample;

async fn seed(pool: &PgPool) {
    create_flow(pool, "ppf", 100, "invoice", "enforce").await;
    create_flow(pool, "ppf", 100, "status-report", "observe").await;
    create_flow(pool, "ppf", 100, "ack", "count").await;
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn enforced_flows_fail_closed_others_keep_answering_and_all_recover(pool: PgPool) {
    seed(&pool).await;
    let (proxy, app) = behind_a_proxy(&pool).await;
    assert_eq!(
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        Outcome::Granted
    );
    let db_now = db_now(&pool).await;

    proxy.cut();

    for _ in 0..3 {
        let started = Instant::now();
        let response = app.post_reserve(json!({"flow": "invoice"})).await;
        let elapsed = started.elapsed();
        assert_eq!(response.status(), 503);
        assert!(elapsed < Duration::from_secs(2), "503 took {elapsed:?}");
        assert!(response.headers().contains_key("retry-after"));
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        // The quota's policy, but nothing left to tell: nothing was counted.
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"ppf\";q=100;w=3600"
        );
        assert!(!response.headers().contains_key("ratelimit"));
        let problem: Value = response.json().await.unwrap();
        assert!(problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/store-unavailable"));
        assert!(
            !problem.to_string().contains("127.0.0.1"),
            "no internal detail leaks: {problem}"
        );
    }
    let started = Instant::now();
    let observed = app.reserve(json!({"flow": "status-report"})).await;
    assert_eq!(observed.outcome, Outcome::Granted);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        app.reserve(json!({"flow": "ack"})).await.outcome,
        Outcome::Unthrottled
    );
    assert_eq!(
        app.reserve(json!({"flow": "who-knows"})).await.outcome,
        Outcome::Unthrottled
    );
    let started = Instant::now();
    let deadline = db_now + chrono::Duration::minutes(1);
    let bypassed = app
        .reserve(json!({"flow": "invoice", "deadline": deadline}))
        .await;
    assert_eq!(bypassed.outcome, Outcome::Bypassed);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a bypass never waits for the store"
    );

    proxy.restore();

    let outcome = eventually(Duration::from_secs(10), Some(Outcome::Granted), || async {
        let response = app.post_reserve(json!({"flow": "invoice"})).await;
        (response.status() == 200)
            .then_some(())
            .map(|_| Outcome::Granted)
    })
    .await;
    assert_eq!(outcome, Some(Outcome::Granted), "recovers by itself");
    // 2 grants, plus observe, count and bypass counted after the fact.
    let counted = eventually(Duration::from_secs(10), 5, || current_count(&pool, "ppf")).await;
    assert_eq!(
        counted, 5,
        "slots spent during the outage are on the record"
    );
}

/// The other side of the unreachable store below: with the store there and
/// the catalog read, the replica says it is ready, and why.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_replica_whose_store_answers_is_ready(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let readiness = || async {
        let response = app.get("/readyz").send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.json::<Value>().await.unwrap()
    };
    // The test server replicates to no standby: asynchronous, read by the
    // first catalog sync.
    let expected = json!({"ready": true, "store": true, "catalog": true, "fresh": true,
                          "durability": "asynchronous"});
    assert_eq!(
        eventually(Duration::from_secs(5), expected.clone(), readiness).await,
        expected
    );
    let metrics = metrics_text(&app.client, &app.base).await;
    assert_eq!(
        sample(&metrics, "quota_arbiter_store_synchronous"),
        Some("0"),
        "{metrics}"
    );
    let timeline =
        sample(&metrics, "quota_arbiter_store_timeline").and_then(|t| t.parse::<i64>().ok());
    assert!(timeline.is_some_and(|t| t >= 1), "{metrics}");
    let dashboard = app.get("/").send().await.unwrap().text().await.unwrap();
    assert!(
        dashboard.contains("replicates asynchronously"),
        "{dashboard}"
    );
}

/// A replica whose catalog cannot be reloaded for longer than
/// `catalog_stale_after` (its reads of the flow table held up, as a hung
/// sync or a dead listener would leave it) may be obeying a flag changed
/// since: it is not ready and its enforced decisions fail closed, while
/// observed flows and due work keep answering; once its reloads go through
/// again, it is ready and decides again.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_catalog_not_reloaded_within_its_bound_fails_closed_until_it_is(pool: PgPool) {
    seed(&pool).await;
    let mut config = test_config();
    config.catalog_stale_after = Duration::from_secs(3);
    let app = TestApp::spawn_with(pool.clone(), config).await;
    let ready = || async { app.get("/readyz").send().await.unwrap().status().as_u16() };
    assert_eq!(ready().await, 200);
    let invoice = json!({"flow": "invoice"});
    assert_eq!(app.reserve(invoice.clone()).await.outcome, Outcome::Granted);

    let mut held = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE flow IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    assert_eq!(eventually(Duration::from_secs(10), 503, ready).await, 503);
    let readiness: Value = app
        .get("/readyz")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(readiness["fresh"], false, "{readiness}");
    assert_eq!(readiness["store"], true, "{readiness}");
    let metrics = metrics_text(&app.client, &app.base).await;
    let age: f64 = sample(&metrics, "quota_arbiter_catalog_age_seconds")
        .and_then(|age| age.parse().ok())
        .expect("the catalog's age is exposed");
    assert!(age > 3.0, "{age}");
    let refused = app.post_reserve(invoice.clone()).await;
    assert_eq!(refused.status(), 503);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem_slug(&problem), "store-unavailable", "{problem}");
    let observed = app.reserve(json!({"flow": "status-report"})).await;
    assert_eq!(observed.outcome, Outcome::Granted);
    let due = json!({"flow": "invoice", "deadline": Utc::now() + chrono::Duration::minutes(1)});
    assert_eq!(app.reserve(due).await.outcome, Outcome::Bypassed);

    held.rollback().await.unwrap();
    assert_eq!(eventually(Duration::from_secs(10), 200, ready).await, 200);
    assert_eq!(app.reserve(invoice).await.outcome, Outcome::Granted);
}

/// Each background loop whose statement fails at the store (the catalog sync
/// and the tally flush held on a lock, then every backend of the replica
/// ended, the listener's too) logs it, counts it
/// (`quota_arbiter_background_failures_total{task}`) and goes on: the
/// listener listens again, the tallies it could not write are written, the
/// catalog is fresh again.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_background_loop_that_fails_at_the_store_is_counted_and_goes_on(pool: PgPool) {
    seed(&pool).await;
    let app = TestApp::spawn(pool.clone()).await;
    let listeners = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(eventually(Duration::from_secs(5), 1, listeners).await, 1);
    let failures = |task: &'static str| {
        let app = &app;
        async move {
            let metrics = metrics_text(&app.client, &app.base).await;
            let series = format!("quota_arbiter_background_failures_total{{task=\"{task}\"}}");
            sample(&metrics, &series).and_then(|n| n.parse::<u64>().ok())
        }
    };
    for task in ["catalog_sync", "catalog_listen", "tally_flush", "prune"] {
        assert_eq!(failures(task).await, Some(0), "{task} counted from zero");
    }

    let mut held = pool.begin().await.unwrap();
    let held_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await
        .unwrap();
    sqlx::query("LOCK TABLE flow, decision_tally IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    for _ in 0..5 {
        let observed = app.reserve(json!({"flow": "status-report"})).await;
        assert_eq!(observed.outcome, Outcome::Granted);
    }
    // The sync and the flush are now waiting on the locks.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend'
           AND pid <> pg_backend_pid() AND pid <> $1",
    )
    .bind(held_pid)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(ended >= 3, "the replica's backends: {ended}");
    held.rollback().await.unwrap();

    for task in ["catalog_sync", "catalog_listen", "tally_flush"] {
        let counted = eventually(Duration::from_secs(10), true, || async {
            failures(task).await.is_some_and(|n| n >= 1)
        })
        .await;
        assert!(counted, "{task}: {:?}", failures(task).await);
    }
    assert_eq!(eventually(Duration::from_secs(10), 1, listeners).await, 1);
    let tallied = eventually(Duration::from_secs(10), 5, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(granted), 0)::bigint FROM decision_tally WHERE flow = 'status-report'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(tallied, 5, "the tallies kept for the next flush");
    let ready = || async { app.get("/readyz").send().await.unwrap().status().as_u16() };
    assert_eq!(eventually(Duration::from_secs(10), 200, ready).await, 200);
}

/// The pruning pass that fails at the store (held on a lock, then its
/// backend ended) is counted and tried again within seconds, not at the next
/// minute's pass: the done item past its retention goes all the same.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_pruning_pass_that_fails_is_counted_and_tried_again_soon(pool: PgPool) {
    seed(&pool).await;
    sqlx::query(
        "INSERT INTO work_item (flow, priority, payload, state, done_at)
         VALUES ('invoice', 2, '{}', 'done', arbiter_now() - interval '30 days')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut held = pool.begin().await.unwrap();
    let held_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await
        .unwrap();
    sqlx::query("LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    // The first pass, at start-up, waits on the lock: end it.
    let pruning = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%DELETE FROM work_item%'",
        )
        .fetch_optional(&pool)
        .await
        .unwrap()
        .is_some()
    };
    assert!(eventually(Duration::from_secs(5), true, pruning).await);
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'
           AND query LIKE '%DELETE FROM work_item%' AND pid <> $1",
    )
    .bind(held_pid)
    .execute(&pool)
    .await
    .unwrap();
    held.rollback().await.unwrap();
    let failures = || async {
        let metrics = metrics_text(&app.client, &app.base).await;
        sample(
            &metrics,
            r#"quota_arbiter_background_failures_total{task="prune"}"#,
        )
        .and_then(|n| n.parse::<u64>().ok())
    };
    let counted = eventually(Duration::from_secs(5), true, || async {
        failures().await.is_some_and(|n| n >= 1)
    })
    .await;
    assert!(counted, "{:?}", failures().await);
    let started = Instant::now();
    let left = eventually(Duration::from_secs(10), 0, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM work_item")
            .fetch_one(&pool)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(left, 0, "the next pass pruned it");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_replica_with_an_unreachable_store_starts_and_still_bypasses(pool: PgPool) {
    let _ = pool;
    // Nothing listens on port 1: every connection attempt is refused.
    let replica = Replica::spawn("postgres://postgres@127.0.0.1:1/quota_arbiter").await;
    let client = reqwest::Client::new();

    let ready = client
        .get(format!("{}/readyz", replica.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(
        client
            .get(format!("{}/healthz", replica.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let deadline = Utc::now() + chrono::Duration::minutes(2);
    let response = client
        .post(format!("{}/v1/reserve", replica.base))
        .json(&json!({"flow": "invoice", "deadline": deadline}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.json::<Decision>().await.unwrap().outcome,
        Outcome::Bypassed
    );

    // Without ever reading the catalog it cannot tell an enforced flow from an
    // observed or unknown one: every flow without a due deadline fails closed.
    for flow in ["invoice", "status-report", "never-declared"] {
        let started = Instant::now();
        let response = client
            .post(format!("{}/v1/reserve", replica.base))
            .json(&json!({"flow": flow}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 503, "{flow}");
        assert!(response.headers().contains_key("retry-after"));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    // A batch: the due item is bypassed, the others say `unavailable`.
    let items = json!({"items": [
        {"flow": "invoice", "ref": "a"},
        {"flow": "invoice", "ref": "due", "deadline": deadline},
        {"flow": "never-declared", "ref": "b"},
    ]});
    let answer = post_batch(&client, &replica.base, items).await;
    assert_eq!(answer.status(), 200);
    let outcomes = batch_outcomes(answer).await;
    assert_eq!(outcomes, ["unavailable", "bypassed", "unavailable"]);
    let undecided = json!({"items": [{"flow": "invoice"}, {"flow": "never-declared"}]});
    let started = Instant::now();
    let answer = post_batch(&client, &replica.base, undecided).await;
    assert_eq!(answer.status(), 503, "nothing could be decided");
    assert!(answer.headers().contains_key("retry-after"));
    // No catalog was ever read: no quota to name.
    assert!(!answer.headers().contains_key("ratelimit-policy"));
    assert!(!answer.headers().contains_key("ratelimit"));
    assert!(started.elapsed() < Duration::from_secs(2));

    let started = Instant::now();
    let response = client
        .get(format!("{}/v1/flows", replica.base))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "the admin API too");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A store that answers too late: the row is locked by someone else for
/// longer than the decision may wait.
async fn slow_store_app(pool: &PgPool) -> TestApp {
    let mut config = test_config();
    config.store_timeout = Duration::from_millis(300);
    TestApp::spawn_with(pool.clone(), config).await
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_observation_the_store_answers_late_is_granted_at_once_and_counted_once(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 2, "status-report", "observe").await;
    let app = slow_store_app(&pool).await;
    app.reserve(json!({"flow": "status-report", "count": 2}))
        .await;
    let tx = lock_window(&pool, "ppf").await;

    let started = Instant::now();
    let decision = app.reserve(json!({"flow": "status-report"})).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the emission waited on the store"
    );
    assert_eq!(decision.outcome, Outcome::Granted);
    assert!(!decision.would_defer, "not known yet when answered");
    let metrics = metrics_text(&app.client, &app.base).await;
    assert!(
        metrics.contains("quota_arbiter_store_errors_total{operation=\"reserve\"} 1\n"),
        "the early answer shows as a store error"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.rollback().await.unwrap();

    // The statement that was still running is the record: counted once, and
    // its would-defer reaches the tallies late.
    let would_defer = eventually(Duration::from_secs(10), 1, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(would_defer), 0)::bigint FROM decision_tally WHERE flow = 'status-report'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(would_defer, 1);
    tokio::time::sleep(Duration::from_millis(1000)).await; // flushes come every 250 ms
    assert_eq!(current_count(&pool, "ppf").await, 3);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_enforced_grant_nobody_waited_for_is_given_back(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let app = slow_store_app(&pool).await;
    app.reserve(json!({"flow": "invoice", "count": 4})).await;
    let tx = lock_window(&pool, "ppf").await;

    let response = app.post_reserve(json!({"flow": "invoice"})).await;
    assert_eq!(response.status(), 503, "no answer in time is no grant");
    tx.rollback().await.unwrap();

    // The upsert went through once the lock was gone; nobody emits on it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counted = eventually(Duration::from_secs(5), 4, || current_count(&pool, "ppf")).await;
    assert_eq!(counted, 4, "the late slot is given back");
    let decisions: Vec<Decision> = {
        let mut all = Vec::new();
        for _ in 0..8 {
            all.push(app.reserve(json!({"flow": "invoice"})).await);
        }
        all
    };
    let granted = decisions
        .iter()
        .filter(|d| d.outcome == Outcome::Granted)
        .count();
    assert_eq!(granted, 6, "the whole ceiling is still there to grant");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_late_grant_with_a_concurrency_lease_is_undone(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 10, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 1").await;
    let app = slow_store_app(&pool).await;
    // A first grant creates the window row; its lease is freed at once.
    let first = app.reserve(json!({"flow": "invoice"})).await;
    let lease_id = first.lease_id.unwrap();
    app.post_json(
        "/v1/report",
        json!({"flow": "invoice", "lease_id": lease_id}),
    )
    .await;
    // Long holds on record: a lease now lasts 60 s, well past this test.
    sqlx::query("UPDATE flow_lease_duration SET avg_seconds = 30 WHERE flow = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    let tx = lock_window(&pool, "api").await;

    let response = app.post_reserve(json!({"flow": "invoice"})).await;
    assert_eq!(response.status(), 503, "no answer in time is no grant");
    tx.rollback().await.unwrap();

    // The statement went through once the lock was gone; nobody emits on it:
    // its slot goes back and its lease is freed, so the only place is free.
    // Until the late statement commits, the window and the slot still read
    // as before it: wait for the undo's lease release (a second sample of
    // the flow's hold time), which comes after its give-back.
    eventually(Duration::from_secs(5), 2, || {
        hold_time_samples(&pool, "invoice")
    })
    .await;
    let leases: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM quota_place WHERE quota = 'api' AND valid_until > arbiter_now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let undone = (current_count(&pool, "api").await, leases);
    assert_eq!(undone, (1, 0), "(window count, live leases)");
    let again = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(again.outcome, Outcome::Granted, "{again:?}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_endpoint_that_needs_the_store_answers_503_in_an_outage(pool: PgPool) {
    seed(&pool).await;
    let (proxy, app) = behind_a_proxy(&pool).await;
    let dashboard = app.admin(Method::GET, "/").send().await.unwrap();
    assert_eq!(dashboard.status(), 200);

    proxy.cut();

    let admin = [
        (Method::GET, "/v1/flows", None),
        (Method::GET, "/v1/quotas", None),
        (Method::GET, "/v1/quotas/ppf", None),
        (Method::GET, "/v1/windows", None),
        (Method::GET, "/v1/report", None),
        (
            Method::PATCH,
            "/v1/flows/invoice",
            Some(json!({"priority": 1})),
        ),
        (
            Method::PUT,
            "/v1/quotas/ppf",
            Some(json!({"hourly_ceiling": 5})),
        ),
    ];
    let worker = [
        (
            Method::POST,
            "/v1/report",
            Some(json!({"quota": "ppf", "status": 429})),
        ),
        (
            Method::POST,
            "/v1/work",
            Some(json!({"flow": "invoice", "payload": {}})),
        ),
        (Method::GET, "/v1/work/1", None),
    ];
    for (method, path, body) in admin.into_iter().chain(worker) {
        let mut request = app.admin(method.clone(), path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let started = Instant::now();
        let response = request.send().await.unwrap();
        let elapsed = started.elapsed();
        assert_eq!(response.status(), 503, "{method} {path}");
        assert!(
            elapsed < Duration::from_secs(2),
            "{method} {path} took {elapsed:?}"
        );
        assert!(
            response.headers().contains_key("retry-after"),
            "{method} {path}"
        );
        let problem: Value = response.json().await.unwrap();
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .ends_with("/store-unavailable"),
            "{method} {path}: {problem}"
        );
    }
    let started = Instant::now();
    let page = app.get("/").send().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(page.status(), 503);
    assert!(page.headers().contains_key("retry-after"));
    let html = page.text().await.unwrap();
    assert!(
        html.contains(r#"class="banner""#) && html.contains("cannot be reached"),
        "{html}"
    );
}

/// Statements of other sessions running in this database right now.
async fn active_statements(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until no statement runs and `ppf`'s window counts `slots`.
async fn settles_at(pool: &PgPool, slots: i64) {
    let settled = eventually(Duration::from_secs(5), (slots, 0), || async {
        (
            current_count(pool, "ppf").await,
            active_statements(pool).await,
        )
    })
    .await;
    assert_eq!(settled, (slots, 0), "(window count, statements running)");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn slots_a_claim_took_after_its_caller_gave_up_are_given_back(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let app = slow_store_app(&pool).await;
    app.reserve(json!({"flow": "invoice", "count": 4})).await;
    for i in 0..3 {
        let item = json!({"flow": "invoice", "payload": {}, "ref": format!("w-{i}")});
        let response = app.post("/v1/work").json(&item).send();
        assert_eq!(response.await.unwrap().status(), 201);
    }
    let tx = lock_window(&pool, "ppf").await;
    let response = app
        .post("/v1/work/claim")
        .json(&json!({"worker": "w-1", "max": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "no answer in time is no claim");
    tx.rollback().await.unwrap();

    // The take goes through once the lock is gone; nobody claimed with it.
    settles_at(&pool, 4).await;
    let claimed: Value = app
        .post_json("/v1/work/claim", json!({"worker": "w-2", "max": 10}))
        .await;
    assert_eq!(claimed["items"].as_array().unwrap().len(), 3, "{claimed}");
    let counted = eventually(Duration::from_secs(5), 7, || current_count(&pool, "ppf")).await;
    assert_eq!(
        counted, 7,
        "three items, three slots: the unused seven went back"
    );
}

/// Makes every spend of `quota_window` fail inside the store, as a statement
/// PostgreSQL rejects would: the store is there, the statement is wrong.
async fn reject_window_writes(pool: &PgPool) {
    sqlx::query(
        "CREATE FUNCTION reject_window_write() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'window write rejected by the test'; END $$",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER reject_window_write BEFORE INSERT OR UPDATE ON quota_window \
         FOR EACH ROW EXECUTE FUNCTION reject_window_write()",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_statement_the_store_rejects_is_a_500_never_store_unavailable(pool: PgPool) {
    seed(&pool).await;
    let app = TestApp::spawn(pool.clone()).await;
    let enqueued = app
        .post("/v1/work")
        .json(&json!({"flow": "invoice", "payload": {}}))
        .send();
    assert_eq!(enqueued.await.unwrap().status(), 201);
    reject_window_writes(&pool).await;

    let calls = [
        ("/v1/reserve", json!({"flow": "invoice"})),
        ("/v1/reserve/batch", json!({"items": [{"flow": "invoice"}]})),
        ("/v1/work/claim", json!({"worker": "w-1"})),
    ];
    for (path, body) in calls {
        let response = app.post(path).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 500, "{path}");
        assert!(!response.headers().contains_key("retry-after"), "{path}");
        let request_id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let problem: Value = response.json().await.unwrap();
        assert!(
            problem["type"].as_str().unwrap().ends_with("/internal"),
            "{path}: {problem}"
        );
        assert_eq!(
            problem["request_id"],
            request_id.as_str(),
            "{path}: the id to quote"
        );
        assert!(
            !problem.to_string().contains("rejected by the test"),
            "no internal detail leaks: {problem}"
        );
    }
    // Observe mode still never refuses: its slot is counted after the fact.
    let observed = app.reserve(json!({"flow": "status-report"})).await;
    assert_eq!(observed.outcome, Outcome::Granted);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn slots_a_batch_took_after_its_caller_gave_up_are_given_back(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let app = slow_store_app(&pool).await;
    app.reserve(json!({"flow": "invoice", "count": 4})).await;
    let tx = lock_window(&pool, "ppf").await;
    let batch = json!({"items": [{"flow": "invoice", "count": 2}, {"flow": "invoice"}]});
    let response = app.post_batch(batch).await;
    assert_eq!(response.status(), 503, "no answer in time is no grant");
    tx.rollback().await.unwrap();

    // The take went through once the lock was gone; nobody emits on it.
    settles_at(&pool, 4).await;
}

/// With the store out of reach a batch still answers every item it can:
/// due items are bypassed, observed, counted and unknown ones answered as on
/// `/v1/reserve`, enforced ones (budget-only and paced alike) `unavailable`;
/// only a batch where nothing could be decided is a 503.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_batch_decides_what_it_can_while_the_store_is_out_of_reach(pool: PgPool) {
    seed(&pool).await;
    create_flow(&pool, "paced", 100, "ping", "enforce").await;
    set_limits(&pool, "paced", "rate = 5, burst = 5").await;
    let (proxy, app) = behind_a_proxy(&pool).await;
    assert_eq!(
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        Outcome::Granted
    );
    let db_now = db_now(&pool).await;
    let due = db_now + chrono::Duration::minutes(1);

    proxy.cut();

    let items = json!({"items": [
        {"flow": "invoice", "ref": "enforced"},
        {"flow": "ping", "ref": "paced"},
        {"flow": "invoice", "ref": "due", "deadline": due},
        {"flow": "status-report", "ref": "observed"},
        {"flow": "ack", "ref": "counted"},
        {"flow": "who-knows", "ref": "unknown"},
    ]});
    let started = Instant::now();
    let answer = app.post_batch(items).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(answer.status(), 200);
    // The policies of the quotas drawn on, and nothing left to tell: the
    // store counted nothing.
    assert_eq!(
        answer.headers()["ratelimit-policy"],
        "\"ppf\";q=100;w=3600, \"paced\";q=100;w=3600"
    );
    assert!(!answer.headers().contains_key("ratelimit"));
    assert_eq!(
        batch_outcomes(answer).await,
        [
            "unavailable",
            "unavailable",
            "bypassed",
            "granted",
            "unthrottled",
            "unthrottled"
        ]
    );

    let enforced_only = json!({"items": [{"flow": "invoice"}, {"flow": "ping"}]});
    let started = Instant::now();
    let answer = app.post_batch(enforced_only).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(answer.status(), 503, "nothing could be decided");
    assert!(answer.headers().contains_key("retry-after"));
    assert_eq!(
        answer.headers()["ratelimit-policy"],
        "\"ppf\";q=100;w=3600, \"paced\";q=100;w=3600"
    );
    assert!(!answer.headers().contains_key("ratelimit"));
    let problem: Value = answer.json().await.unwrap();
    assert!(problem["type"]
        .as_str()
        .unwrap()
        .ends_with("/store-unavailable"));

    proxy.restore();

    // 1 grant before the cut; bypass, observe and count counted after the fact;
    // nothing spent for the unavailable items.
    let counted = eventually(Duration::from_secs(10), 4, || current_count(&pool, "ppf")).await;
    assert_eq!(counted, 4);
}
