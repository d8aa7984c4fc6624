//! POST /v1/reserve against the in-process app and a real database.

use std::sync::Arc;
use std::time::Duration;

use chrono::Timelike;
use quota_arbiter::domain::catalog::Mode;
use quota_arbiter::domain::decision::Outcome;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, db_now, eventually, header_once, lock_window, pin_clock,
    reserve_all_at_once, set_limits, sync_and_invoice, TestApp,
};

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn enforced_flow_grants_up_to_the_ceiling_then_defers_until_the_next_window(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 3, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    for _ in 0..3 {
        let decision = app.reserve(json!({"flow": "invoice"})).await;
        assert_eq!(decision.outcome, Outcome::Granted);
        assert_eq!(decision.mode, Some(Mode::Enforce));
        assert_eq!(decision.quota.as_deref(), Some("ppf"));
        let start = decision.window_start.expect("granted carries window_start");
        assert_eq!(
            (start.minute(), start.second(), start.nanosecond()),
            (0, 0, 0)
        );
    }
    // A client clock in the Date header changes nothing: database time only.
    let response = app
        .post("/v1/reserve")
        .header("date", "Sat, 01 Jan 2000 00:00:00 GMT")
        .json(&json!({"flow": "invoice", "ref": "inv-42"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let retry_after: i64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let decision: quota_arbiter::domain::decision::Decision = response.json().await.unwrap();
    assert_eq!(decision.outcome, Outcome::Deferred);
    let window_start = decision.window_start.unwrap();
    assert_eq!(
        decision.retry_at,
        Some(window_start + chrono::Duration::hours(1))
    );
    // The database clock reads ~10 minutes past the hour: ~50 minutes to wait.
    assert_eq!(decision.retry_after_seconds, Some(retry_after));
    assert!(
        (2900..=3000).contains(&retry_after),
        "retry_after {retry_after}"
    );
    assert_eq!(
        current_count(&pool, "ppf").await,
        3,
        "a refusal spends nothing"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn count_reserves_all_or_nothing(pool: PgPool) {
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    assert_eq!(
        app.reserve(json!({"flow": "invoice", "count": 3}))
            .await
            .outcome,
        Outcome::Granted
    );
    // 3 + 3 > 5: refused whole, nothing taken.
    assert_eq!(
        app.reserve(json!({"flow": "invoice", "count": 3}))
            .await
            .outcome,
        Outcome::Deferred
    );
    assert_eq!(current_count(&pool, "ppf").await, 3);
    assert_eq!(
        app.reserve(json!({"flow": "invoice", "count": 2}))
            .await
            .outcome,
        Outcome::Granted
    );
    assert_eq!(current_count(&pool, "ppf").await, 5);
    // A first reservation larger than the ceiling is refused too (insert branch).
    create_flow(&pool, "small", 2, "batch", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    assert_eq!(
        app.reserve(json!({"flow": "batch", "count": 3}))
            .await
            .outcome,
        Outcome::Deferred
    );
    assert_eq!(current_count(&pool, "small").await, 0);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn ceiling_zero_refuses_everything_in_enforce(pool: PgPool) {
    create_flow(&pool, "closed", 0, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for _ in 0..5 {
        let decision = app.reserve(json!({"flow": "invoice"})).await;
        assert_eq!(decision.outcome, Outcome::Deferred);
        assert!(decision.retry_at.is_some() && decision.retry_after_seconds.is_some());
    }
    assert_eq!(
        current_count(&pool, "closed").await,
        0,
        "not even the first slot"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observe_mode_grants_counts_and_flags_would_defer(pool: PgPool) {
    create_flow(&pool, "ppf", 2, "status-report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    let mut flags = Vec::new();
    for _ in 0..5 {
        let decision = app.reserve(json!({"flow": "status-report"})).await;
        assert_eq!(decision.outcome, Outcome::Granted);
        assert_eq!(decision.mode, Some(Mode::Observe));
        flags.push(decision.would_defer);
    }
    assert_eq!(flags, [false, false, true, true, true]);
    // The honest record: count runs over the ceiling where SQL can see it.
    assert_eq!(current_count(&pool, "ppf").await, 5);
    let tallied = eventually(Duration::from_secs(5), (5, 3), || {
        tally(&pool, "status-report")
    })
    .await;
    assert_eq!(tallied, (5, 3), "granted and would_defer tallied");
}

/// Observed decisions on budget-only quotas share one statement whatever
/// their quota: each quota's count and would-defer flags stay its own.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_observations_across_quotas_count_and_flag_each_quota_alone(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    // (quota, ceiling, flow, requests per wave); "placed" has in-flight
    // places, which observed decisions never take: it goes with the others.
    let quotas = [
        ("qa", 3, "fa", 4),
        ("qb", 7, "fb", 9),
        ("qc", 0, "fc", 2),
        ("placed", 5, "fp", 6),
    ];
    for (quota, ceiling, flow, _) in quotas {
        create_flow(&pool, quota, ceiling, flow, "observe").await;
    }
    set_limits(&pool, "placed", "max_in_flight = 1").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let mut flagged = std::collections::HashMap::<&str, usize>::new();
    // Two waves: the second's groups start from counts that differ by quota.
    for _ in 0..2 {
        let asks = quotas
            .iter()
            .flat_map(|&(quota, _, flow, n)| std::iter::repeat_n((quota, flow), n));
        for (quota, decision) in reserve_all_at_once(&app, asks).await {
            assert_eq!(decision.outcome, Outcome::Granted, "{quota}: {decision:?}");
            assert_eq!(decision.quota.as_deref(), Some(quota));
            *flagged.entry(quota).or_default() += usize::from(decision.would_defer);
        }
    }
    for (quota, ceiling, _, n) in quotas {
        let asked = 2 * n;
        let counted = current_count(&pool, quota).await;
        assert_eq!(counted, asked as i64, "{quota}: every slot counted");
        let past_ceiling = asked - ceiling as usize;
        assert_eq!(
            flagged[quota], past_ceiling,
            "{quota}: flagged past its own ceiling"
        );
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn unknown_flow_is_never_throttled(pool: PgPool) {
    create_flow(&pool, "closed", 0, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for _ in 0..3 {
        let decision = app.reserve(json!({"flow": "never-heard-of-it"})).await;
        assert_eq!(decision.outcome, Outcome::Unthrottled);
        assert_eq!(decision.quota, None);
        assert_eq!(decision.mode, None);
    }
    let unthrottled = eventually(Duration::from_secs(5), 3, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(unthrottled), 0)::bigint FROM decision_tally WHERE flow = 'never-heard-of-it' AND quota IS NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(unthrottled, 3);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn count_mode_is_never_refused_and_is_counted_after_the_fact(pool: PgPool) {
    create_flow(&pool, "ppf", 2, "ack", "count").await;
    let app = TestApp::spawn(pool.clone()).await;
    for _ in 0..5 {
        let decision = app.reserve(json!({"flow": "ack", "count": 2})).await;
        assert_eq!(decision.outcome, Outcome::Unthrottled);
        assert_eq!(decision.mode, Some(Mode::Count));
    }
    let counted = eventually(Duration::from_secs(5), 10, || current_count(&pool, "ppf")).await;
    assert_eq!(
        counted, 10,
        "every slot spent is on the record, over the ceiling or not"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn deadline_within_the_horizon_bypasses_a_full_quota(pool: PgPool) {
    create_flow(&pool, "closed", 0, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let db_now = db_now(&pool).await;

    let soon = db_now + chrono::Duration::minutes(5);
    let decision = app
        .reserve(json!({"flow": "invoice", "deadline": soon, "ref": "inv-1"}))
        .await;
    assert_eq!(decision.outcome, Outcome::Bypassed);
    assert_eq!(decision.quota.as_deref(), Some("closed"));
    // Overdue work bypasses too.
    let overdue = db_now - chrono::Duration::minutes(5);
    assert_eq!(
        app.reserve(json!({"flow": "invoice", "deadline": overdue}))
            .await
            .outcome,
        Outcome::Bypassed
    );
    // Further than the horizon (15 min): the normal path, which defers.
    let later = db_now + chrono::Duration::minutes(30);
    assert_eq!(
        app.reserve(json!({"flow": "invoice", "deadline": later}))
            .await
            .outcome,
        Outcome::Deferred
    );

    let counted = eventually(Duration::from_secs(5), 2, || current_count(&pool, "closed")).await;
    assert_eq!(counted, 2, "bypasses are counted after the fact");
    let bypassed = eventually(Duration::from_secs(5), 2, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(bypassed), 0)::bigint FROM decision_tally WHERE flow = 'invoice'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(bypassed, 2, "bypasses are flagged in the tallies");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn bad_input_gets_a_4xx_problem_never_a_500(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let long_name = "f".repeat(200);
    let cases: Vec<(&str, String)> = vec![
        ("malformed json", "{\"flow\": ".into()),
        ("not an object", "[1, 2]".into()),
        (
            "unknown field",
            json!({"flow": "invoice", "colour": "red"}).to_string(),
        ),
        ("missing flow", json!({"count": 1}).to_string()),
        ("empty flow", json!({"flow": ""}).to_string()),
        ("over-long flow", json!({"flow": long_name}).to_string()),
        ("flow with spaces", json!({"flow": "in voice"}).to_string()),
        (
            "count zero",
            json!({"flow": "invoice", "count": 0}).to_string(),
        ),
        (
            "count negative",
            json!({"flow": "invoice", "count": -3}).to_string(),
        ),
        (
            "count absurd",
            json!({"flow": "invoice", "count": 1_000_000_000}).to_string(),
        ),
        (
            "count beyond i64",
            "{\"flow\": \"invoice\", \"count\": 99999999999999999999999}".into(),
        ),
        (
            "count fractional",
            json!({"flow": "invoice", "count": 1.5}).to_string(),
        ),
        (
            "count as string",
            json!({"flow": "invoice", "count": "2"}).to_string(),
        ),
        (
            "bad timestamp",
            json!({"flow": "invoice", "deadline": "tomorrow"}).to_string(),
        ),
        (
            "timestamp without zone",
            json!({"flow": "invoice", "deadline": "2026-11-30T14:30:00"}).to_string(),
        ),
        (
            "over-long ref",
            json!({"flow": "invoice", "ref": "r".repeat(300)}).to_string(),
        ),
        (
            "huge body",
            json!({"flow": "invoice", "ref": "r".repeat(100_000)}).to_string(),
        ),
    ];
    for (name, body) in cases {
        let response = app
            .post("/v1/reserve")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        assert!(status.is_client_error(), "{name}: got {status}");
        assert_problem(response, name).await;
    }
    let malformed = app
        .post("/v1/reserve")
        .header("content-type", "application/json")
        .body("{\"flow\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let problem: serde_json::Value = malformed.json().await.unwrap();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/malformed-json"),
        "{problem}"
    );
    let no_content_type = app
        .post("/v1/reserve")
        .body(json!({"flow": "invoice"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(no_content_type.status(), 415);
    assert_problem(no_content_type, "no content type").await;
    let unknown_route = app.get("/v1/nope").send().await.unwrap();
    assert_eq!(unknown_route.status(), 404);
    assert_problem(unknown_route, "unknown route").await;
    assert_eq!(
        current_count(&pool, "ppf").await,
        0,
        "no bad request spent a slot"
    );
}

async fn assert_problem(response: reqwest::Response, case: &str) {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json",
        "{case}: problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert!(
        problem["type"].as_str().unwrap().contains("/problems/"),
        "{case}: {problem}"
    );
    assert!(problem["status"].as_u64().unwrap() >= 400, "{case}");
    assert!(
        problem["title"].is_string() && problem["detail"].is_string(),
        "{case}"
    );
}

async fn tally(pool: &PgPool, flow: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(sum(granted), 0)::bigint, coalesce(sum(would_defer), 0)::bigint
         FROM decision_tally WHERE flow = $1",
    )
    .bind(flow)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_mixed_counts_never_over_grant_and_leave_no_stray_slots(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = std::sync::Arc::new(TestApp::spawn(pool.clone()).await);
    let mut callers = Vec::new();
    for i in 0..64_i64 {
        let app = app.clone();
        callers.push(tokio::spawn(async move {
            let count = i % 3 + 1;
            let decision = app
                .reserve(json!({"flow": "invoice", "count": count}))
                .await;
            if decision.outcome == Outcome::Granted {
                count
            } else {
                0
            }
        }));
    }
    let mut granted = 0;
    for caller in callers {
        granted += caller.await.unwrap();
    }
    assert!(
        granted <= 100,
        "{granted} slots granted against a ceiling of 100"
    );
    assert!(
        granted >= 98,
        "demand of 128 leaves at most the odd slot unused: {granted}"
    );
    // Slots taken for a group but not usable by it were given back.
    assert_eq!(current_count(&pool, "ppf").await, granted);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_requests_for_many_quotas_share_statements_and_get_exactly_each_ceiling(
    pool: PgPool,
) {
    let pool = pin_clock(&pool, 10).await;
    const QUOTAS: usize = 20;
    for q in 0..QUOTAS {
        create_flow(
            &pool,
            &format!("q{q:02}"),
            5,
            &format!("f{q:02}"),
            "enforce",
        )
        .await;
    }
    // Two replicas: their statements lock overlapping sets of window rows.
    let apps = [
        TestApp::spawn(pool.clone()).await,
        TestApp::spawn(pool.clone()).await,
    ];
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..(QUOTAS * 20) {
        let app = &apps[i % 2];
        let (client, base) = (app.client.clone(), app.base.clone());
        let count = if i % 7 == 0 { 2 } else { 1 };
        let body = json!({"flow": format!("f{:02}", (i * 7) % QUOTAS), "count": count});
        calls.spawn(async move {
            let response = crate::helpers::post_reserve(&client, &base, body).await;
            assert_eq!(response.status(), 200, "no deadlock, no outage");
            let decision: Value = response.json().await.unwrap();
            (
                decision["flow"].as_str().unwrap().to_string(),
                decision["outcome"] == "granted",
                count,
            )
        });
    }
    let mut granted = std::collections::BTreeMap::<String, i64>::new();
    while let Some(answer) = calls.join_next().await {
        let (flow, was_granted, count) = answer.unwrap();
        *granted.entry(flow).or_default() += if was_granted { count } else { 0 };
    }
    for q in 0..QUOTAS {
        let slots = granted.get(&format!("f{q:02}")).copied().unwrap_or(0);
        assert_eq!(slots, 5, "f{q:02}: exactly its ceiling granted");
        assert_eq!(
            current_count(&pool, &format!("q{q:02}")).await,
            5,
            "q{q:02}"
        );
    }
}

async fn observe_batch(app: &TestApp, count: i64) -> Value {
    let items = json!({"items": [{"flow": "status-report", "count": count}]});
    let response = app
        .post("/v1/reserve/batch")
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["decisions"][0].clone()
}

/// Observations queued behind a statement still running are spent together
/// in one statement: each on its own quota, each told whether it went past
/// the ceiling by its own slots (in arrival order), not by the group's.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observations_spent_together_each_say_whether_they_went_past_the_ceiling(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "status-report", "observe").await;
    create_flow(&pool, "other", 5, "sync", "observe").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    app.reserve(json!({"flow": "status-report"})).await;
    let tx = lock_window(&pool, "ppf").await;
    let pause = || tokio::time::sleep(Duration::from_millis(250));

    // The first group: one observation, held by the lock.
    let first = tokio::spawn({
        let app = app.clone();
        async move { app.reserve(json!({"flow": "status-report"})).await }
    });
    pause().await;
    // The next group of `ppf`: 1 slot, then 3 (with one of another quota between).
    let within = tokio::spawn({
        let app = app.clone();
        async move { observe_batch(&app, 1).await }
    });
    pause().await;
    let elsewhere = app.reserve(json!({"flow": "sync"})).await;
    assert_eq!(elsewhere.outcome, Outcome::Granted);
    let past = tokio::spawn({
        let app = app.clone();
        async move { observe_batch(&app, 3).await }
    });
    pause().await;
    tx.rollback().await.unwrap();

    assert_eq!(first.await.unwrap().outcome, Outcome::Granted);
    let (within, past) = (within.await.unwrap(), past.await.unwrap());
    // 2 before the group: 3 after the first (within 5), 6 after the second.
    assert_eq!(within["would_defer"], false, "{within}");
    assert_eq!(past["would_defer"], true, "{past}");
    assert_eq!(current_count(&pool, "ppf").await, 6);
    assert_eq!(current_count(&pool, "other").await, 1);
}

/// A `/v1/reserve` answer with its RateLimit fields and `Retry-After`.
struct Fielded {
    decision: quota_arbiter::domain::decision::Decision,
    policy: Option<String>,
    ratelimit: Option<String>,
    retry_after: Option<u64>,
}

impl Fielded {
    /// `r` and `t` of the RateLimit field, after checking it names `quota`.
    fn r_and_t(&self, quota: &str) -> (u64, u64) {
        let field = self.ratelimit.as_deref().expect("a RateLimit field");
        let rest = field
            .strip_prefix(&format!("\"{quota}\";r="))
            .unwrap_or_else(|| panic!("names {quota}: {field}"));
        let (r, t) = rest.split_once(";t=").expect("r and t");
        (r.parse().unwrap(), t.parse().unwrap())
    }
}

async fn reserve_fielded(app: &TestApp, body: Value) -> Fielded {
    let response = app.post_reserve(body).await;
    assert_eq!(response.status(), 200);
    let header = |name: &str| header_once(&response, name);
    let (policy, ratelimit) = (header("ratelimit-policy"), header("ratelimit"));
    let retry_after = header("retry-after").map(|s| s.parse().unwrap());
    Fielded {
        decision: response.json().await.unwrap(),
        policy,
        ratelimit,
        retry_after,
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn ratelimit_fields_count_an_enforced_quota_down_and_agree_with_retry_after(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    let mut left = Vec::new();
    for _ in 0..5 {
        let answer = reserve_fielded(&app, json!({"flow": "invoice"})).await;
        assert_eq!(answer.decision.outcome, Outcome::Granted);
        assert_eq!(answer.policy.as_deref(), Some("\"ppf\";q=5;w=3600"));
        assert_eq!(answer.retry_after, None);
        let (r, t) = answer.r_and_t("ppf");
        // ~10 minutes past the hour: ~50 minutes until the window ends.
        assert!((2900..=3000).contains(&t), "t {t}");
        left.push(r);
    }
    assert_eq!(left, [4, 3, 2, 1, 0], "exactly what the window has left");

    let deferred = reserve_fielded(&app, json!({"flow": "invoice"})).await;
    assert_eq!(deferred.decision.outcome, Outcome::Deferred);
    assert_eq!(deferred.policy.as_deref(), Some("\"ppf\";q=5;w=3600"));
    let (r, t) = deferred.r_and_t("ppf");
    assert_eq!(r, 0);
    assert_eq!(Some(t), deferred.retry_after, "t is Retry-After");
    assert_eq!(deferred.decision.retry_after_seconds, Some(t as i64));
    // The body is unchanged: the fields are headers only.
    let body = app
        .post_json("/v1/reserve", json!({"flow": "invoice"}))
        .await;
    assert!(body.get("quota_limit").is_none(), "{body}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_policy_names_the_quota_and_the_ceiling_of_the_flows_priority(pool: PgPool) {
    sync_and_invoice(&pool, "crm", 10).await;
    set_limits(&pool, "crm", "priority3_share = 50").await;
    create_flow(&pool, "closed", 0, "nothing", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    let sync = reserve_fielded(&app, json!({"flow": "sync", "count": 2})).await;
    assert_eq!(sync.decision.outcome, Outcome::Granted);
    assert_eq!(sync.policy.as_deref(), Some("\"crm\";q=5;w=3600"));
    assert_eq!(sync.r_and_t("crm").0, 3, "5 for priority 3, 2 taken");
    let invoice = reserve_fielded(&app, json!({"flow": "invoice"})).await;
    assert_eq!(invoice.policy.as_deref(), Some("\"crm\";q=10;w=3600"));
    assert_eq!(invoice.r_and_t("crm").0, 7, "10 for priority 1, 3 taken");
    // A zero ceiling defers before any count: nothing left until the window ends.
    let closed = reserve_fielded(&app, json!({"flow": "nothing"})).await;
    assert_eq!(closed.decision.outcome, Outcome::Deferred);
    assert_eq!(closed.policy.as_deref(), Some("\"closed\";q=0;w=3600"));
    let (r, t) = closed.r_and_t("closed");
    assert_eq!((r, Some(t)), (0, closed.retry_after));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_cadence_deferral_says_nothing_is_left_until_retry_after(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 0.01, burst = 1, adaptive = false").await;
    let app = TestApp::spawn(pool.clone()).await;

    let granted = reserve_fielded(&app, json!({"flow": "invoice"})).await;
    assert_eq!(granted.decision.outcome, Outcome::Granted);
    assert_eq!(granted.r_and_t("api").0, 999, "the window's budget");
    let deferred = reserve_fielded(&app, json!({"flow": "invoice"})).await;
    assert_eq!(
        (deferred.decision.outcome, deferred.decision.limit),
        (
            Outcome::Deferred,
            Some(quota_arbiter::domain::decision::Limit::Cadence)
        )
    );
    let (r, t) = deferred.r_and_t("api");
    assert_eq!((r, Some(t)), (0, deferred.retry_after));
    assert!(t >= 90, "a token in ~100 s: {t}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observed_answers_count_down_past_the_ceiling_to_zero(pool: PgPool) {
    create_flow(&pool, "ppf", 2, "status-report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    let mut left = Vec::new();
    for _ in 0..4 {
        let answer = reserve_fielded(&app, json!({"flow": "status-report"})).await;
        assert_eq!(answer.decision.outcome, Outcome::Granted);
        assert_eq!(answer.policy.as_deref(), Some("\"ppf\";q=2;w=3600"));
        left.push(answer.r_and_t("ppf").0);
    }
    assert_eq!(left, [1, 0, 0, 0]);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn bypassed_counted_and_unknown_answers_carry_no_ratelimit_field(pool: PgPool) {
    create_flow(&pool, "closed", 0, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 2, "ack", "count").await;
    let app = TestApp::spawn(pool.clone()).await;
    let db_now = db_now(&pool).await;

    let soon = db_now + chrono::Duration::minutes(5);
    let bypassed = reserve_fielded(&app, json!({"flow": "invoice", "deadline": soon})).await;
    assert_eq!(bypassed.decision.outcome, Outcome::Bypassed);
    assert_eq!(bypassed.policy.as_deref(), Some("\"closed\";q=0;w=3600"));
    assert_eq!(bypassed.ratelimit, None, "the bypass never reads the count");

    let counted = reserve_fielded(&app, json!({"flow": "ack"})).await;
    assert_eq!(counted.decision.outcome, Outcome::Unthrottled);
    assert_eq!(counted.policy.as_deref(), Some("\"ppf\";q=2;w=3600"));
    assert_eq!(counted.ratelimit, None, "counted after the fact");

    let unknown = reserve_fielded(&app, json!({"flow": "never-heard-of-it"})).await;
    assert_eq!(unknown.decision.outcome, Outcome::Unthrottled);
    assert_eq!((unknown.policy, unknown.ratelimit), (None, None));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_grants_each_say_what_the_window_held_right_after_them(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    // Budget-only quotas are decided across quotas; one with in-flight places
    // by its own group statement.
    create_flow(&pool, "plain", 6, "invoice", "enforce").await;
    create_flow(&pool, "placed", 6, "sync", "enforce").await;
    set_limits(&pool, "placed", "max_in_flight = 100").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    for (quota, flow) in [("plain", "invoice"), ("placed", "sync")] {
        let callers: Vec<_> = (0..10)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { reserve_fielded(&app, json!({"flow": flow})).await })
            })
            .collect();
        let mut left = Vec::new();
        for caller in callers {
            let answer = caller.await.unwrap();
            assert!(answer.ratelimit.is_some(), "{quota}: {:?}", answer.decision);
            let (r, t) = answer.r_and_t(quota);
            match answer.decision.outcome {
                Outcome::Granted => left.push(r),
                Outcome::Deferred => assert_eq!((r, Some(t)), (0, answer.retry_after)),
                other => panic!("{other:?}"),
            }
        }
        left.sort_unstable();
        // Each grant counted once, in the order the group was decided.
        assert_eq!(left, [0, 1, 2, 3, 4, 5], "{quota}");
    }
}
