//! Several quotas per call (design.md §12): a flow that spends several
//! quotas spends every window of every one of them in each call, or none,
//! decided in one statement with its concurrent neighbours.

use quota_arbiter::domain::decision::{Decision, Limit, Outcome};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{cli, pin_clock, stdout, TestApp};
use crate::replicas::{count, hammer, three_replicas, DEMAND};

/// Quota `name` of `windows`.
async fn quota(app: &TestApp, name: &str, windows: Value) {
    app.admin_json(
        Method::PUT,
        &format!("/v1/quotas/{name}"),
        Some(json!({ "windows": windows })),
    )
    .await;
}

/// An LLM's quotas: requests (`requests` a minute, `day` a day) and tokens
/// (`tokens` a minute), and flow `chat` in `mode` that spends all of them.
pub(crate) async fn llm(app: &TestApp, requests: i64, day: i64, tokens: i64, mode: &str) {
    let requests_windows =
        json!([{"period": "1m", "ceiling": requests}, {"period": "1d", "ceiling": day}]);
    quota(app, "llm-requests", requests_windows).await;
    quota(
        app,
        "llm-tokens",
        json!([{"period": "1m", "ceiling": tokens}]),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/chat",
        Some(json!({"quotas": ["llm-requests", "llm-tokens"], "mode": mode})),
    )
    .await;
}

/// Each window's count of `quota`, shortest first.
async fn counts(pool: &PgPool, quota: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT count FROM quota_window WHERE quota = $1
         ORDER BY coalesce(period_seconds(period), 9999999999)",
    )
    .bind(quota)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Three replicas, 2000 calls from 64 callers, each spending one request
/// and one token: the tokens' minute (300) is the tightest window of both
/// quotas, so exactly 300 are granted, and every window of both quotas
/// counts exactly 300 — no call spent one quota without the other.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn three_replicas_never_spend_one_quota_without_the_other(pool: PgPool) {
    // Mid-minute and mid-hour: the run falls in one window of each.
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm(&app, 1000, 5000, 300, "enforce").await;
    let replicas = three_replicas(&pool).await;

    let decisions = hammer(&replicas, "chat").await;

    assert_eq!(decisions.len(), DEMAND);
    assert_eq!(count(&decisions, Outcome::Granted), 300);
    assert_eq!(count(&decisions, Outcome::Deferred), DEMAND - 300);
    let deferred = decisions
        .iter()
        .find(|d| d.outcome == Outcome::Deferred)
        .unwrap();
    assert_eq!(
        (deferred.limit, deferred.period.as_deref()),
        (Some(Limit::Budget), Some("1m"))
    );
    assert_eq!(counts(&pool, "llm-requests").await, [300, 300]);
    assert_eq!(counts(&pool, "llm-tokens").await, [300]);
}

/// A call refused by one quota spends nothing of the other; a later,
/// smaller call still fits; the answer carries every window of both
/// quotas, and its RateLimit fields a policy for each.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_call_spends_every_quota_or_none(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm(&app, 10, 100, 1000, "enforce").await;

    let response = app
        .post_reserve(json!({"flow": "chat", "spend": {"llm-tokens": 600}}))
        .await;
    let policy = response.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_string();
    let granted: Decision = response.json().await.unwrap();
    assert_eq!(granted.outcome, Outcome::Granted);
    assert_eq!(granted.quota.as_deref(), Some("llm-requests"));
    let windows: Vec<(String, String, Option<i64>)> = granted
        .windows
        .unwrap()
        .into_iter()
        .map(|w| (w.quota, w.period, w.left))
        .collect();
    assert_eq!(
        windows,
        [
            ("llm-requests".into(), "1m".into(), Some(9)),
            ("llm-requests".into(), "1d".into(), Some(99)),
            ("llm-tokens".into(), "1m".into(), Some(400)),
        ]
    );
    for item in [
        "\"llm-requests-1m\";q=10;w=60",
        "\"llm-requests-1d\";q=100;w=86400",
        "\"llm-tokens-1m\";q=1000;w=60",
    ] {
        assert!(policy.contains(item), "{item} in {policy}");
    }

    // 600 more tokens do not fit: refused by the tokens' minute, and the
    // requests it would have spent stay unspent.
    let refused = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 600}}))
        .await;
    assert_eq!(refused.outcome, Outcome::Deferred);
    assert_eq!(refused.period.as_deref(), Some("1m"));
    assert_eq!(counts(&pool, "llm-requests").await, [1, 1]);
    assert_eq!(counts(&pool, "llm-tokens").await, [600]);

    // 400 still fit.
    let smaller = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 400}}))
        .await;
    assert_eq!(smaller.outcome, Outcome::Granted);
    assert_eq!(counts(&pool, "llm-requests").await, [2, 2]);
    assert_eq!(counts(&pool, "llm-tokens").await, [1000]);
}

/// The statement alone, a group at once: calls decided first fit in the
/// order given, each all or nothing across both quotas.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn one_statement_decides_a_group_first_fit_each_call_all_or_nothing(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    sqlx::query(
        "INSERT INTO quota (name, hourly_ceiling) VALUES ('requests', 3), ('tokens', 100);",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Four calls of (1 request, t tokens): 60, 50 (does not fit after 60),
    // 40, 10 (the requests' hour is full after three).
    let rows: Vec<(i32, bool, i64)> = sqlx::query_as(
        "SELECT o_call, o_granted, o_count_before FROM take_linked(
             array[1,1,2,2,3,3,4,4], array['requests','tokens','requests','tokens',
                                           'requests','tokens','requests','tokens'],
             array['1h','1h','1h','1h','1h','1h','1h','1h'], array[null,null,null,null,null,null,null,null]::text[],
             array[1,60,1,50,1,40,1,10]::bigint[], array[3,100,3,100,3,100,3,100]::bigint[], false)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let granted: Vec<(i32, bool)> = rows.iter().map(|r| (r.0, r.1)).step_by(2).collect();
    assert_eq!(granted, [(1, true), (2, false), (3, true), (4, false)]);
    assert_eq!(
        rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        [0, 0, 1, 60, 1, 60, 2, 100],
        "each call sees the grants decided before it"
    );
    assert_eq!(counts(&pool, "requests").await, [2]);
    assert_eq!(counts(&pool, "tokens").await, [100]);
}

/// Observe mode spends every quota whatever the counts, and says which
/// window enforcement would have deferred on.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observe_mode_spends_every_quota_and_flags_the_would_be_refusal(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm(&app, 10, 100, 1000, "observe").await;
    let over = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 1500}}))
        .await;
    assert_eq!(over.outcome, Outcome::Granted);
    assert!(over.would_defer);
    assert_eq!(over.period.as_deref(), Some("1m"));
    assert_eq!(counts(&pool, "llm-requests").await, [1, 1]);
    assert_eq!(counts(&pool, "llm-tokens").await, [1500]);
}

/// A settlement of a call that spent two quotas: what `spent` names is
/// settled to the actual, the rest as estimated; the answer lists both.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_settlement_settles_each_quota_the_call_spent(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm(&app, 10, 100, 10000, "enforce").await;
    let granted = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 3500}}))
        .await;
    let id = granted.reservation_id.expect("a reservation to settle");
    let answer = app
        .post_json(
            "/v1/settle",
            json!({"reservation_id": id.to_string(), "spent": {"llm-tokens": 2310}}),
        )
        .await;
    assert_eq!(answer["quota"], "llm-requests", "the flow's own, first");
    assert_eq!(answer["spent"], 1);
    let tokens = &answer["quotas"][1];
    assert_eq!(
        (&tokens["quota"], &tokens["given_back"], &tokens["spent"]),
        (&json!("llm-tokens"), &json!(1190), &json!(2310))
    );
    assert_eq!(counts(&pool, "llm-tokens").await, [2310]);
    assert_eq!(counts(&pool, "llm-requests").await, [1, 1]);
    // A quota the reservation did not spend is refused.
    let granted = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 10}}))
        .await;
    let wrong = app
        .post("/v1/settle")
        .json(
            &json!({"reservation_id": granted.reservation_id.unwrap().to_string(),
                       "spent": {"other": 1}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 422);
}

/// A flow moved from one quota to two spends both from its next call on;
/// the CLI and the API say so, and what cannot be spent together is refused.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_flow_moved_from_one_quota_to_two_spends_both(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    quota(&app, "requests", json!([{"period": "1h", "ceiling": 100}])).await;
    quota(&app, "tokens", json!([{"period": "1h", "ceiling": 1000}])).await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/chat",
        Some(json!({"quota": "requests", "mode": "enforce"})),
    )
    .await;
    app.reserve(json!({"flow": "chat"})).await;
    assert_eq!(counts(&pool, "requests").await, [1]);
    assert!(counts(&pool, "tokens").await.is_empty());

    let output = cli(
        &pool,
        &["flow", "chat", "--quota", "requests", "--quota", "tokens"],
    )
    .await;
    assert!(output.status.success(), "{}", stdout(&output));
    // The CLI wrote the table; this replica hears of it and reloads.
    let mut moved = Value::Null;
    for _ in 0..50 {
        moved = app.admin_json(Method::GET, "/v1/flows/chat", None).await;
        if moved["quotas"] == json!(["requests", "tokens"]) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(moved["quotas"], json!(["requests", "tokens"]));
    assert_eq!(moved["quota"], "requests");
    // The table is written; the replica's catalog follows within moments.
    let mut spent_both = false;
    for _ in 0..50 {
        let decision = app.reserve(json!({"flow": "chat"})).await;
        if decision.windows.as_ref().is_some_and(|w| w.len() == 2) {
            spent_both = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(spent_both, "the catalog reloaded");
    assert_eq!(counts(&pool, "tokens").await, [1]);
    let decision = app
        .reserve(json!({"flow": "chat", "spend": {"tokens": 7}}))
        .await;
    assert_eq!(decision.outcome, Outcome::Granted);
    assert_eq!(counts(&pool, "tokens").await, [8]);

    // Refused: a quota named twice, a paced quota beside another, a cadence
    // on a quota spent beside another, deleting a further quota.
    let twice = app
        .admin(Method::PUT, "/v1/flows/other")
        .json(&json!({"quotas": ["tokens", "tokens"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 422);
    let paced = app
        .admin(Method::PUT, "/v1/quotas/tokens")
        .json(&json!({"hourly_ceiling": 1000, "rate": 5, "burst": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(paced.status(), 422, "{}", paced.text().await.unwrap());
    quota(&app, "paced", json!([{"period": "1h", "ceiling": 10}])).await;
    app.admin_json(
        Method::PATCH,
        "/v1/quotas/paced",
        Some(json!({"max_in_flight": 2})),
    )
    .await;
    let beside = app
        .admin(Method::PUT, "/v1/flows/other")
        .json(&json!({"quotas": ["tokens", "paced"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(beside.status(), 422);
    let deleted = app
        .admin(Method::DELETE, "/v1/quotas/tokens")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 409);
    sqlx::query("DELETE FROM quota_window WHERE quota = 'tokens'")
        .execute(&pool)
        .await
        .unwrap();
    let raw = sqlx::query("DELETE FROM quota WHERE name = 'tokens'")
        .execute(&pool)
        .await;
    let refused = raw.expect_err("raw SQL cannot delete a quota a flow spends");
    assert!(refused.to_string().contains("spent by a flow"), "{refused}");
    let unknown = app
        .post_reserve(json!({"flow": "chat", "spend": {"other": 3}}))
        .await;
    assert_eq!(unknown.status(), 422);
}
