//! Budget vs cadence vs in-flight: a token bucket beside the hourly budget,
//! adaptive shrinking, concurrency leases and priority headroom.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quota_arbiter::domain::decision::{Decision, Limit, Outcome};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, db_now, pin_clock, set_limits, sync_and_invoice, TestApp,
};

async fn bucket_tokens(pool: &PgPool, quota: &str) -> f64 {
    sqlx::query_scalar("SELECT tokens FROM quota_bucket WHERE quota = $1")
        .bind(quota)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_budget_is_spendable_in_one_burst_right_after_the_hour_turns(pool: PgPool) {
    // A second past the hour: the window is brand new and quiet.
    let pool = pin_clock(&pool, 0).await;
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    // A three-call operation goes at once; so does the rest of the budget.
    let decision = app.reserve(json!({"flow": "invoice", "count": 3})).await;
    assert_eq!(decision.outcome, Outcome::Granted);
    for _ in 0..7 {
        assert_eq!(
            app.reserve(json!({"flow": "invoice"})).await.outcome,
            Outcome::Granted
        );
    }
    let refused = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(
        (refused.outcome, refused.limit),
        (Outcome::Deferred, Some(Limit::Budget))
    );
    assert_eq!(
        refused.retry_at,
        refused.window_start.map(|w| w + chrono::Duration::hours(1))
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn cadence_grants_the_burst_at_once_then_the_sustained_rate(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 4, burst = 5").await;

    // The burst: exactly `burst` at once (a second quota that barely refills,
    // so a slow machine cannot blur the count).
    create_flow(&pool, "slow-api", 1000, "batch", "enforce").await;
    set_limits(&pool, "slow-api", "rate = 0.001, burst = 5").await;
    let app = TestApp::spawn(pool.clone()).await;
    let mut outcomes = Vec::new();
    for _ in 0..8 {
        outcomes.push(app.reserve(json!({"flow": "batch"})).await.outcome);
    }
    let granted = outcomes.iter().filter(|o| **o == Outcome::Granted).count();
    assert_eq!(granted, 5, "burst of 5 at once: {outcomes:?}");

    // Drain the 4/s quota, then the refusal points at the next token, by the
    // database clock, not at the next window.
    let deferred = loop {
        let decision = app.reserve(json!({"flow": "invoice"})).await;
        if decision.outcome == Outcome::Deferred {
            break decision;
        }
    };
    assert_eq!(deferred.limit, Some(Limit::Cadence));
    let db_now = db_now(&pool).await;
    let wait = deferred.retry_at.unwrap() - db_now;
    assert!(
        wait <= chrono::Duration::milliseconds(250),
        "next token within 1/rate s: {wait}"
    );
    assert!(
        deferred.retry_after_seconds.is_some_and(|s| s <= 1),
        "Retry-After rounds the fraction of a second up"
    );

    // Then the sustained rate: over 2.5 s of polling, about 4/s are granted.
    // Tolerance: +-2 grants for scheduling jitter at the edges of the period.
    let started = Instant::now();
    let mut sustained = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        if app.reserve(json!({"flow": "invoice"})).await.outcome == Outcome::Granted {
            sustained += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        (8..=12).contains(&sustained),
        "~10 grants in 2.5 s at 4/s, got {sustained}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn budget_and_cadence_are_both_or_neither(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 2, "invoice", "enforce").await;
    // Practically no refill during the test.
    set_limits(&pool, "api", "rate = 0.01, burst = 5, adaptive = false").await;
    let app = TestApp::spawn(pool.clone()).await;

    assert_eq!(
        app.reserve(json!({"flow": "invoice", "count": 2}))
            .await
            .outcome,
        Outcome::Granted
    );
    // The budget refuses: no token is spent.
    let tokens = bucket_tokens(&pool, "api").await;
    let refused = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(refused.limit, Some(Limit::Budget));
    assert!(
        (bucket_tokens(&pool, "api").await - tokens).abs() < 1e-9,
        "a budget refusal spends no token"
    );

    // Cadence refuses: no budget slot is spent.
    set_limits(&pool, "api", "hourly_ceiling = 100").await;
    let app = TestApp::spawn(pool.clone()).await;
    let refused = app.reserve(json!({"flow": "invoice", "count": 4})).await;
    assert_eq!(
        (refused.outcome, refused.limit),
        (Outcome::Deferred, Some(Limit::Cadence))
    );
    assert_eq!(
        current_count(&pool, "api").await,
        2,
        "a cadence refusal spends no budget slot"
    );
    assert_eq!(
        app.reserve(json!({"flow": "invoice", "count": 3}))
            .await
            .outcome,
        Outcome::Granted
    );
    assert_eq!(current_count(&pool, "api").await, 5);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_full_window_outranks_missing_tokens(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 2, "invoice", "enforce").await;
    // Two tokens, practically no refill: the grant below empties the bucket
    // and fills the window at once.
    set_limits(&pool, "api", "rate = 0.01, burst = 2, adaptive = false").await;
    let app = TestApp::spawn(pool.clone()).await;
    let granted = app.reserve(json!({"flow": "invoice", "count": 2})).await;
    assert_eq!(granted.outcome, Outcome::Granted);

    // Both refuse now; the window's end is the earliest anything could be
    // granted, although a token comes back sooner. The statement takes
    // nothing, so it says so from the window's count as it read it.
    let refused = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(
        (refused.outcome, refused.limit),
        (Outcome::Deferred, Some(Limit::Budget))
    );
    assert_eq!(
        refused.retry_at,
        refused.window_start.map(|w| w + chrono::Duration::hours(1))
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_restart_does_not_refill_the_bucket(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 0.01, burst = 3").await;
    let app = TestApp::spawn(pool.clone()).await;
    for _ in 0..3 {
        assert_eq!(
            app.reserve(json!({"flow": "invoice"})).await.outcome,
            Outcome::Granted
        );
    }
    drop(app);
    let restarted = TestApp::spawn(pool.clone()).await;
    assert_eq!(
        restarted.reserve(json!({"flow": "invoice"})).await.limit,
        Some(Limit::Cadence)
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn upstream_429_shrinks_the_cadence_and_quiet_restores_it(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 10, burst = 20").await;
    let app = TestApp::spawn(pool.clone()).await;
    let answer = app
        .post_json("/v1/report", json!({"flow": "invoice", "status": 429}))
        .await;
    assert!(
        (answer["effective_rate"].as_f64().unwrap() - 7.0).abs() < 0.01,
        "{answer}"
    );
    assert!(
        (answer["effective_burst"].as_f64().unwrap() - 14.0).abs() < 0.02,
        "{answer}"
    );
    let quota = quota_row(&app).await;
    assert!(
        (quota["effective_rate"].as_f64().unwrap() - 7.0).abs() < 0.05,
        "{quota}"
    );

    // 90 s of quiet, by moving the stored timestamp back rather than sleeping.
    sqlx::query(
        "UPDATE quota_bucket SET factor_at = factor_at - interval '90 seconds' WHERE quota = 'api'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let quota = quota_row(&app).await;
    assert_eq!(
        quota["effective_rate"].as_f64(),
        Some(10.0),
        "back to the configured rate: {quota}"
    );
    assert_eq!(quota["effective_burst"].as_f64(), Some(20.0));

    // Successes never push past the configured values; adaptive = false ignores reports.
    for _ in 0..5 {
        app.post_json("/v1/report", json!({"flow": "invoice", "status": 200}))
            .await;
    }
    assert_eq!(quota_row(&app).await["effective_rate"].as_f64(), Some(10.0));
    set_limits(&pool, "api", "adaptive = false").await;
    app.post_json("/v1/report", json!({"flow": "invoice", "status": 429}))
        .await;
    assert_eq!(quota_row(&app).await["effective_rate"].as_f64(), Some(10.0));
}

/// A report names a quota the catalog knows, or it is a 404: never a no-op.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_report_about_an_unknown_quota_is_not_found(pool: PgPool) {
    create_flow(&pool, "api", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    app.post_json("/v1/report", json!({"quota": "api", "status": 200}))
        .await;
    let unknown = app
        .post("/v1/report")
        .json(&json!({"quota": "nope", "status": 429}));
    let unknown = unknown.send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    let problem: Value = unknown.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("nope"),
        "{problem}"
    );
}

async fn quota_row(app: &TestApp) -> Value {
    let quotas: Value = app.admin_json(Method::GET, "/v1/quotas", None).await;
    quotas["quotas"][0].clone()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn expired_leases_free_their_place_and_reports_free_it_sooner(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 1").await;
    let app = TestApp::spawn(pool.clone()).await;

    let held = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(held.outcome, Outcome::Granted);
    let lease_id = held.lease_id.expect("a grant holds a lease");
    let valid_until = held.valid_until.unwrap();
    let validity = valid_until - held.window_start.unwrap();
    assert!(validity > chrono::Duration::zero());
    let full = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(
        (full.outcome, full.limit),
        (Outcome::Deferred, Some(Limit::InFlight))
    );
    assert_eq!(
        full.retry_at,
        Some(valid_until),
        "retry when the first lease expires"
    );
    assert_eq!(
        current_count(&pool, "api").await,
        1,
        "an in-flight refusal spends no budget"
    );

    // A crashed worker never reports: its lease expires by itself.
    sqlx::query("UPDATE quota_place SET valid_until = arbiter_now() - interval '1 second' WHERE lease_id = $1")
        .bind(lease_id)
        .execute(&pool)
        .await
        .unwrap();
    let next = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(next.outcome, Outcome::Granted);
    // The stale lease can no longer free the place someone else holds now.
    let stale = app
        .post_json(
            "/v1/report",
            json!({"flow": "invoice", "lease_id": lease_id}),
        )
        .await;
    assert_eq!(stale["released"], false);
    let lease_id = next.lease_id.unwrap();
    let freed = app
        .post_json(
            "/v1/report",
            json!({"flow": "invoice", "lease_id": lease_id, "status": 200}),
        )
        .await;
    assert_eq!(freed["released"], true);
    assert!(freed["avg_lease_seconds"].as_f64().is_some());
    assert_eq!(
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        Outcome::Granted
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn lease_validity_follows_the_flows_average_hold_time(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 2").await;
    let app = TestApp::spawn(pool.clone()).await;
    let first = app.reserve(json!({"flow": "invoice"})).await;
    let now = db_now(&pool).await;
    let secs = (first.valid_until.unwrap() - now).num_milliseconds() as f64 / 1000.0;
    assert!(
        (29.0..=30.5).contains(&secs),
        "30 s before any history, got {secs}"
    );
    sqlx::query("INSERT INTO flow_lease_duration (flow, avg_seconds) VALUES ('invoice', 1.0)")
        .execute(&pool)
        .await
        .unwrap();
    let second = app.reserve(json!({"flow": "invoice"})).await;
    let now = db_now(&pool).await;
    let secs = (second.valid_until.unwrap() - now).num_milliseconds() as f64 / 1000.0;
    assert!(
        (4.0..=5.5).contains(&secs),
        "2 x 1 s clamped up to 5 s, got {secs}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn eight_concurrent_workers_never_exceed_max_in_flight(pool: PgPool) {
    create_flow(&pool, "api", 100_000, "invoice", "enforce").await;
    // A cadence too, so concurrent grants take slot, bucket and window locks together.
    set_limits(&pool, "api", "max_in_flight = 3, rate = 1000, burst = 1000").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let in_flight = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (app, in_flight, peak) = (app.clone(), in_flight.clone(), peak.clone());
        workers.push(tokio::spawn(async move {
            let mut emitted = 0;
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                let decision: Decision = app.reserve(json!({"flow": "invoice"})).await;
                if decision.outcome != Outcome::Granted {
                    assert_eq!(decision.limit, Some(Limit::InFlight));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let lease_id = decision.lease_id.unwrap();
                app.post_json(
                    "/v1/report",
                    json!({"flow": "invoice", "lease_id": lease_id}),
                )
                .await;
                emitted += 1;
            }
            emitted
        }));
    }
    let mut emitted = 0;
    for worker in workers {
        emitted += worker.await.unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 3, "{peak} in flight at once");
    assert_eq!(peak, 3, "the slots were used to the full");
    assert!(emitted > 20, "work got done: {emitted}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn headroom_keeps_the_top_of_the_window_for_priority_1(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    sync_and_invoice(&pool, "ppf", 10).await;
    set_limits(&pool, "ppf", "priority2_share = 90, priority3_share = 80").await;
    let app = TestApp::spawn(pool.clone()).await;

    let mut sync_granted = 0;
    for _ in 0..12 {
        if app.reserve(json!({"flow": "sync"})).await.outcome == Outcome::Granted {
            sync_granted += 1;
        }
    }
    assert_eq!(sync_granted, 8, "priority 3 stops at 80% of the ceiling");
    let mut invoice_granted = 0;
    for _ in 0..5 {
        if app.reserve(json!({"flow": "invoice"})).await.outcome == Outcome::Granted {
            invoice_granted += 1;
        }
    }
    assert_eq!(
        invoice_granted, 2,
        "priority 1 gets the rest, never more than the ceiling"
    );
    assert_eq!(current_count(&pool, "ppf").await, 10);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn batches_and_claims_respect_the_cadence(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 0.01, burst = 3, adaptive = false").await;
    let app = TestApp::spawn(pool.clone()).await;

    let items: Vec<Value> = (0..5)
        .map(|i| json!({"flow": "invoice", "ref": format!("b-{i}")}))
        .collect();
    let batch = app
        .post_json("/v1/reserve/batch", json!({ "items": items }))
        .await;
    let outcomes: Vec<&str> = batch["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["granted", "granted", "granted", "deferred", "deferred"]
    );
    assert_eq!(batch["decisions"][3]["limit"], "cadence");
    assert_eq!(current_count(&pool, "api").await, 3);

    // The bucket is empty now: queued work cannot be claimed past it either.
    set_limits(&pool, "api", "burst = 2").await;
    sqlx::query("UPDATE quota_bucket SET tokens = 2 WHERE quota = 'api'")
        .execute(&pool)
        .await
        .unwrap();
    for i in 0..4 {
        let response = app
            .post("/v1/work")
            .json(&json!({"flow": "invoice", "payload": {"n": i}}))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }
    let claim = app
        .post_json("/v1/work/claim", json!({"worker": "w-1", "max": 4}))
        .await;
    assert_eq!(claim["items"].as_array().unwrap().len(), 2, "{claim}");
    assert_eq!(current_count(&pool, "api").await, 5);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_callers_never_outrun_the_cadence(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 100_000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 200, burst = 5, adaptive = false").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let started = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..32 {
        let app = app.clone();
        callers.push(tokio::spawn(async move {
            let mut granted = 0;
            while started.elapsed() < Duration::from_secs(2) {
                if app.reserve(json!({"flow": "invoice"})).await.outcome == Outcome::Granted {
                    granted += 1;
                }
            }
            granted
        }));
    }
    let mut granted = 0;
    for caller in callers {
        granted += caller.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    // burst + rate x elapsed is the most the bucket can give; one token of slack.
    let most = 5.0 + 200.0 * seconds + 1.0;
    assert!(
        (granted as f64) <= most,
        "{granted} grants in {seconds:.2} s, at most {most:.0}"
    );
    assert!(granted as f64 >= 100.0, "the rate is used: {granted}");
    assert_eq!(
        current_count(&pool, "api").await,
        granted as i64,
        "tokens and slots go together"
    );
}

/// `n` concurrent reservations for each flow; granted count per flow.
async fn concurrent_grants(app: &Arc<TestApp>, flows: &[&str], n: usize) -> Vec<usize> {
    let mut callers = Vec::new();
    for _ in 0..n {
        for (i, flow) in flows.iter().enumerate() {
            let (app, flow) = (app.clone(), flow.to_string());
            callers.push(tokio::spawn(async move {
                (i, app.reserve(json!({"flow": flow})).await.outcome)
            }));
        }
    }
    let mut granted = vec![0; flows.len()];
    for caller in callers {
        let (i, outcome) = caller.await.unwrap();
        if outcome == Outcome::Granted {
            granted[i] += 1;
        }
    }
    granted
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_callers_of_mixed_priorities_keep_the_headroom_exact(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    sync_and_invoice(&pool, "ppf", 100).await;
    set_limits(&pool, "ppf", "priority3_share = 80").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);

    let granted = concurrent_grants(&app, &["sync"], 150).await;
    assert_eq!(
        granted,
        vec![80],
        "priority 3 stops exactly at 80% under concurrency"
    );
    // Groups that hold a priority-1 request take up to the full ceiling; the
    // priority-3 requests among them still stop at their 80%.
    let mut invoices = 0;
    for _ in 0..4 {
        let granted = concurrent_grants(&app, &["sync", "sync", "sync", "invoice"], 20).await;
        assert_eq!(
            granted[..3],
            [0, 0, 0],
            "priority 3 never reaches the top 20%"
        );
        invoices += granted[3];
    }
    assert_eq!(invoices, 20, "priority 1 gets exactly the top 20%");
    assert_eq!(current_count(&pool, "ppf").await, 100);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn reports_read_the_upstream_status_by_flow_or_by_quota(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 10, burst = 20").await;
    let app = TestApp::spawn(pool.clone()).await;
    let rate = |answer: &Value| answer["effective_rate"].as_f64();
    // 0 (timeout) x0.8, then a 503 x0.9, by quota; a 404 says nothing about the rate.
    let timeout = app
        .post_json("/v1/report", json!({"quota": "api", "status": 0}))
        .await;
    assert!((rate(&timeout).unwrap() - 8.0).abs() < 0.01, "{timeout}");
    let unavailable = app
        .post_json(
            "/v1/report",
            json!({"flow": "invoice", "status": 503, "duration_ms": 812}),
        )
        .await;
    assert!(
        (rate(&unavailable).unwrap() - 7.2).abs() < 0.01,
        "{unavailable}"
    );
    let not_found = app
        .post_json("/v1/report", json!({"flow": "invoice", "status": 404}))
        .await;
    assert_eq!(rate(&not_found), None, "no adaptation: {not_found}");

    for bad in [
        json!({"status": 429}),
        json!({"flow": "invoice", "quota": "api", "status": 429}),
        json!({"flow": "invoice"}),
        json!({"flow": "invoice", "status": 700}),
        json!({"flow": "invoice", "status": 200, "duration_ms": 3_600_001}),
        json!({"flow": "invoice", "upstream": "429"}),
    ] {
        let response = app.post("/v1/report").json(&bad).send().await.unwrap();
        assert_eq!(response.status(), 422, "{bad}");
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_reported_duration_feeds_the_flows_average_hold_time(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 2").await;
    let app = TestApp::spawn(pool.clone()).await;
    let granted = app.reserve(json!({"flow": "invoice"})).await;
    let lease_id = granted.lease_id.unwrap();
    let answer = app
        .post_json(
            "/v1/report",
            json!({"flow": "invoice", "lease_id": lease_id, "status": 200, "duration_ms": 2500}),
        )
        .await;
    assert_eq!(answer["released"], json!(true));
    assert_eq!(answer["held_seconds"].as_f64(), Some(2.5), "{answer}");
    assert_eq!(
        answer["avg_lease_seconds"].as_f64(),
        Some(2.5),
        "first sample"
    );
}

/// A rate near the smallest double would underflow in the refill (an error
/// for every decision on the quota): the API refuses a rate below 10⁻⁶ per
/// second for a quota and a route class, and so does the table.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_rate_too_small_to_refill_is_refused_everywhere(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    for rate in [5e-324, 1e-7] {
        let quota = app
            .admin(reqwest::Method::PUT, "/v1/quotas/tiny")
            .json(&json!({"hourly_ceiling": 10, "rate": rate, "burst": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(quota.status(), 422, "quota rate {rate}");
        let class = app
            .admin(reqwest::Method::PUT, "/v1/route-classes/tiny")
            .json(&json!({"burst": 1, "rate": rate, "capacity": 10,
                          "window_seconds": 60, "tenant_share": 1.0}))
            .send()
            .await
            .unwrap();
        assert_eq!(class.status(), 422, "route class rate {rate}");
    }
    let smallest = app
        .admin(reqwest::Method::PUT, "/v1/quotas/tiny")
        .json(&json!({"hourly_ceiling": 10, "rate": 1e-6, "burst": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(smallest.status(), 200);
    let raw = sqlx::query("UPDATE quota SET rate = 1e-300 WHERE name = 'tiny'")
        .execute(&pool)
        .await;
    assert!(raw.is_err(), "the table refuses it too");
}
