//! Estimates settled to the actual (design.md §12): a reservation of an
//! estimate answers a `reservation_id`; its settlement gives back what was
//! over-estimated to the windows still open, takes what was under-estimated
//! without refusal (tallied `overspent`), once, within `settle_within`, by
//! the key that reserved.

use quota_arbiter::domain::decision::{Decision, Outcome};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{pin_clock, pin_clock_to, TestApp};

/// Quota `llm-tokens` of a minute of 10,000 and a day of 100,000, and an
/// enforced flow `chat` that spends it.
async fn tokens(app: &TestApp) {
    let windows = json!([{"period": "1m", "ceiling": 10000}, {"period": "1d", "ceiling": 100000}]);
    app.admin_json(
        Method::PUT,
        "/v1/quotas/llm-tokens",
        Some(json!({ "windows": windows })),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/chat",
        Some(json!({"quota": "llm-tokens", "mode": "enforce"})),
    )
    .await;
}

async fn counts(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT count FROM quota_window WHERE quota = 'llm-tokens'
         ORDER BY coalesce(period_seconds(period), 9999999999)",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn settle(app: &TestApp, body: Value) -> reqwest::Response {
    app.post("/v1/settle").json(&body).send().await.unwrap()
}

/// Reserved 3500, spent 2310: 1190 go back to both windows; a second
/// settlement is a 409 and changes nothing.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_over_estimate_goes_back_to_every_window_once(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    tokens(&app).await;
    let granted: Decision = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 3500}}))
        .await;
    assert_eq!(granted.outcome, Outcome::Granted);
    let id = granted.reservation_id.expect("a reservation to settle");
    assert_eq!(counts(&pool).await, [3500, 3500]);
    let answer = settle(
        &app,
        json!({"reservation_id": id.to_string(), "spent": {"llm-tokens": 2310}}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["given_back"], 1190);
    assert_eq!(answer["overspent"], 0);
    assert_eq!(
        answer["reservation_id"],
        id.to_string(),
        "a string of digits"
    );
    assert_eq!(counts(&pool).await, [2310, 2310]);
    let again = settle(
        &app,
        json!({"reservation_id": id.to_string(), "spent": {"llm-tokens": 10}}),
    )
    .await;
    assert_eq!(again.status(), 409);
    assert_eq!(counts(&pool).await, [2310, 2310]);
    // A reservation without an estimate has nothing to settle.
    let plain = app.reserve(json!({"flow": "chat"})).await;
    assert_eq!(plain.reservation_id, None);
    let unknown = settle(&app, json!({"reservation_id": "12345"})).await;
    assert_eq!(unknown.status(), 404);
}

/// Spent more than estimated: taken without refusal, past the ceiling if
/// it comes to that (it already happened), and tallied `overspent`.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_under_estimate_is_taken_without_refusal_and_tallied(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    tokens(&app).await;
    let granted = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 9000}}))
        .await;
    let id = granted.reservation_id.unwrap();
    let answer: Value = settle(
        &app,
        json!({"reservation_id": id.to_string(), "spent": {"llm-tokens": 12000}}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(answer["overspent"], 3000);
    assert_eq!(
        counts(&pool).await,
        [12000, 12000],
        "count > ceiling shows it"
    );
    let overspent: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(overspent), 0)::bigint FROM decision_tally WHERE flow = 'chat'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(overspent, 3000);
    // The minute is over its ceiling now: the next estimate waits.
    let refused = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 1}}))
        .await;
    assert_eq!(refused.outcome, Outcome::Deferred);
    assert_eq!(refused.period.as_deref(), Some("1m"));
}

/// Past `settle_within` (10 minutes) a reservation stays spent as
/// estimated; a window that closed meanwhile is never changed.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_late_settlement_is_refused_and_closed_windows_never_change(pool: PgPool) {
    let start = pin_clock_to(&pool, "2026-12-06T10:00:30Z").await;
    let app = TestApp::spawn(start.clone()).await;
    tokens(&app).await;
    let early = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 500}}))
        .await
        .reservation_id
        .unwrap();
    let late = app
        .reserve(json!({"flow": "chat", "spend": {"llm-tokens": 500}}))
        .await
        .reservation_id
        .unwrap();
    drop(app);
    // Two minutes on: the minute window has closed, the day has not.
    let later = pin_clock_to(&pool, "2026-12-06T10:02:30Z").await;
    let app = TestApp::spawn(later.clone()).await;
    let answer: Value = settle(
        &app,
        json!({"reservation_id": early.to_string(), "spent": {"llm-tokens": 100}}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        answer["windows"],
        json!([{"quota": "llm-tokens", "period": "1d", "count": 600}])
    );
    let minute: i64 = sqlx::query_scalar(
        "SELECT count FROM quota_window WHERE quota = 'llm-tokens' AND period = '1m'",
    )
    .fetch_one(&later)
    .await
    .unwrap();
    assert_eq!(minute, 1000, "a closed window keeps what it counted");
    drop(app);
    let too_late = pin_clock_to(&pool, "2026-12-06T10:11:00Z").await;
    let app = TestApp::spawn(too_late).await;
    let refused = settle(&app, json!({"reservation_id": late.to_string()})).await;
    assert_eq!(refused.status(), 409);
    let problem: Value = refused.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("spent as estimated"),
        "{problem}"
    );
}

/// `spend` names the flow's quota, once, within bounds; `spent` names the
/// reservation's.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn spend_and_spent_name_the_quota_they_count(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    tokens(&app).await;
    for body in [
        json!({"flow": "chat", "spend": {"other": 5}}),
        json!({"flow": "chat", "spend": {"llm-tokens": 5}, "count": 5}),
        json!({"flow": "chat", "spend": {"llm-tokens": 0}}),
        json!({"flow": "chat", "spend": {"llm-tokens": 5}, "settle": false}),
        json!({"flow": "chat", "spend": {}}),
    ] {
        assert_eq!(app.post_reserve(body.clone()).await.status(), 422, "{body}");
    }
    let settled = app
        .reserve(json!({"flow": "chat", "count": 3, "settle": true}))
        .await;
    let id = settled.reservation_id.expect("settle: true asks for one");
    let wrong = settle(
        &app,
        json!({"reservation_id": id.to_string(), "spent": {"other": 1}}),
    )
    .await;
    assert_eq!(wrong.status(), 422);
    let as_estimated = settle(&app, json!({"reservation_id": id.to_string()})).await;
    assert_eq!(as_estimated.status(), 200);
}
