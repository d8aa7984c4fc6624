//! Stacked windows (design.md §12): a quota of several periods is decided
//! in every window at once, all or nothing, with the windows aligned by the
//! database (a day in a zone, a calendar month), on every surface.

use chrono::{DateTime, Utc};
use quota_arbiter::domain::decision::{Decision, Limit, Outcome};
use quota_arbiter::domain::window::{Period, WindowRule};
use quota_arbiter::store::{QuotaAsk, Store};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{cli, create_flow, header_once, pin_clock, pin_clock_to, stdout, TestApp};
use crate::replicas::{count, hammer, three_replicas, DEMAND};

/// Each window's count of `quota`, shortest first, as the table holds it.
async fn counts(pool: &PgPool, quota: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT period, count FROM quota_window WHERE quota = $1
         ORDER BY coalesce(period_seconds(period), 9999999999), window_start",
    )
    .bind(quota)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Creates quota `quota` with `windows` and an enforced (or `mode`) flow.
async fn stacked(app: &TestApp, quota: &str, windows: Value, flow: &str, mode: &str) {
    app.admin_json(
        Method::PUT,
        &format!("/v1/quotas/{quota}"),
        Some(json!({ "windows": windows })),
    )
    .await;
    app.admin_json(
        Method::PUT,
        &format!("/v1/flows/{flow}"),
        Some(json!({ "quota": quota, "mode": mode })),
    )
    .await;
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().into()
}

/// Three replicas, 2000 single-slot requests from 64 callers on a quota of
/// 15 minutes (300), an hour (1000) and a day (800): exactly the tightest
/// window's ceiling is granted, and every window counts exactly the grants —
/// a refused call spent nothing anywhere.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn three_replicas_grant_exactly_the_tightest_window_and_refusals_spend_nothing(pool: PgPool) {
    // Ten minutes into the hour: five left in the 15-minute window.
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    let windows = json!([
        {"period": "15m", "ceiling": 300},
        {"period": "1h", "ceiling": 1000},
        {"period": "1d", "ceiling": 800},
    ]);
    stacked(&app, "api", windows, "invoice", "enforce").await;
    let replicas = three_replicas(&pool).await;

    let decisions = hammer(&replicas, "invoice").await;

    assert_eq!(decisions.len(), DEMAND);
    assert_eq!(
        count(&decisions, Outcome::Granted),
        300,
        "the tightest window's ceiling"
    );
    assert_eq!(count(&decisions, Outcome::Deferred), DEMAND - 300);
    let deferred = decisions
        .iter()
        .find(|d| d.outcome == Outcome::Deferred)
        .unwrap();
    assert_eq!(deferred.limit, Some(Limit::Budget));
    assert_eq!(
        deferred.period.as_deref(),
        Some("15m"),
        "the window that refused"
    );
    assert_eq!(
        counts(&pool, "api").await,
        [("15m".into(), 300), ("1h".into(), 300), ("1d".into(), 300)],
        "every window spent exactly the grants"
    );
}

/// Of several windows without room, a deferral names the one that reopens
/// last, and waits for it: the minute alone would reopen too soon.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_deferral_waits_for_every_refusing_window_and_answers_carry_each_window(pool: PgPool) {
    let pool = pin_clock_to(&pool, "2026-03-10T12:30:10Z").await;
    let app = TestApp::spawn(pool.clone()).await;
    let windows = json!([{"period": "1m", "ceiling": 5}, {"period": "1h", "ceiling": 3}]);
    stacked(&app, "llm", windows, "chat", "enforce").await;
    let granted = app.reserve(json!({"flow": "chat", "count": 2})).await;
    assert_eq!(granted.outcome, Outcome::Granted);
    assert_eq!(
        granted.window_start,
        Some(at("2026-03-10T12:00:00Z")),
        "the hour's"
    );
    let states = granted.windows.clone().unwrap();
    let summary: Vec<(String, i64, Option<i64>)> = states
        .iter()
        .map(|w| (w.period.clone(), w.ceiling, w.left))
        .collect();
    assert_eq!(
        summary,
        [("1m".into(), 5, Some(3)), ("1h".into(), 3, Some(1))]
    );
    assert_eq!(states[0].window_start, at("2026-03-10T12:30:00Z"));
    assert_eq!(states[0].ends_at, at("2026-03-10T12:31:00Z"));
    // Two more: the minute has 3 left but the hour only 1: refused by the hour.
    let refused = app.reserve(json!({"flow": "chat", "count": 2})).await;
    assert_eq!(refused.outcome, Outcome::Deferred);
    assert_eq!(refused.period.as_deref(), Some("1h"));
    assert_eq!(refused.retry_at, Some(at("2026-03-10T13:00:00Z")));
    // The RateLimit fields: one policy per window, the tightest window left.
    let response = app.post_reserve(json!({"flow": "chat"})).await;
    assert_eq!(
        header_once(&response, "ratelimit-policy").as_deref(),
        Some(r#""llm-1m";q=5;w=60, "llm";q=3;w=3600"#)
    );
    let limit = header_once(&response, "ratelimit").unwrap();
    assert!(limit.starts_with(r#""llm";r=0;"#), "{limit}");
    assert_eq!(
        counts(&pool, "llm").await,
        [("1m".into(), 3), ("1h".into(), 3)]
    );
}

/// A day in America/Los_Angeles starts at its local midnight: across the
/// spring change it lasts 23 hours, across the autumn one 25; a full day
/// defers until the next local midnight.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_day_in_a_zone_starts_at_local_midnight_and_lasts_23_or_25_hours(pool: PgPool) {
    let day = json!([{"period": "1d", "ceiling": 2, "zone": "America/Los_Angeles"}]);
    // 23:30 on 7 March, Pacific standard time.
    let before = pin_clock_to(&pool, "2026-03-08T07:30:00Z").await;
    let app = TestApp::spawn(before.clone()).await;
    stacked(&app, "maps", day, "geocode", "enforce").await;
    app.reserve(json!({"flow": "geocode", "count": 2})).await;
    let full = app.reserve(json!({"flow": "geocode"})).await;
    assert_eq!(full.outcome, Outcome::Deferred);
    assert_eq!(full.period.as_deref(), Some("1d"));
    assert_eq!(
        full.retry_at,
        Some(at("2026-03-08T08:00:00Z")),
        "local midnight, PST"
    );
    drop(app);

    // Just past it: a new day of 23 hours (midnight PDT is 07:00Z).
    let spring = pin_clock_to(&pool, "2026-03-08T08:00:01Z").await;
    let app = TestApp::spawn(spring).await;
    let granted = app.reserve(json!({"flow": "geocode"})).await;
    assert_eq!(granted.outcome, Outcome::Granted, "a new day");
    let window = &granted.windows.unwrap()[0];
    assert_eq!(window.window_start, at("2026-03-08T08:00:00Z"));
    assert_eq!(window.ends_at, at("2026-03-09T07:00:00Z"), "23 hours");
    drop(app);

    let autumn = pin_clock_to(&pool, "2026-11-01T12:00:00Z").await;
    let app = TestApp::spawn(autumn).await;
    let granted = app.reserve(json!({"flow": "geocode"})).await;
    let window = &granted.windows.unwrap()[0];
    assert_eq!(window.window_start, at("2026-11-01T07:00:00Z"));
    assert_eq!(window.ends_at, at("2026-11-02T08:00:00Z"), "25 hours");
}

/// A month window turns on the first at midnight (UTC here): full on the
/// last second of December, open again in January, counted afresh.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_month_window_turns_at_the_first_of_the_month(pool: PgPool) {
    let december = pin_clock_to(&pool, "2026-12-31T23:59:50Z").await;
    let app = TestApp::spawn(december.clone()).await;
    let month = json!([{"period": "1mo", "ceiling": 1}]);
    stacked(&app, "sms", month, "notify", "enforce").await;
    assert_eq!(
        app.reserve(json!({"flow": "notify"})).await.outcome,
        Outcome::Granted
    );
    let full = app.reserve(json!({"flow": "notify"})).await;
    assert_eq!(full.outcome, Outcome::Deferred);
    assert_eq!(
        (full.period.as_deref(), full.retry_at),
        (Some("1mo"), Some(at("2027-01-01T00:00:00Z")))
    );
    drop(app);
    let january = pin_clock_to(&pool, "2027-01-01T00:00:05Z").await;
    let app = TestApp::spawn(january.clone()).await;
    let granted: Decision = app.reserve(json!({"flow": "notify"})).await;
    assert_eq!(granted.outcome, Outcome::Granted);
    assert_eq!(
        granted.windows.unwrap()[0].window_start,
        at("2027-01-01T00:00:00Z")
    );
    let months: Vec<(DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT window_start, count FROM quota_window WHERE quota = 'sms' ORDER BY 1",
    )
    .fetch_all(&january)
    .await
    .unwrap();
    assert_eq!(
        months,
        [
            (at("2026-12-01T00:00:00Z"), 1),
            (at("2027-01-01T00:00:00Z"), 1)
        ]
    );
}

/// Observe mode spends every window regardless and names the window that
/// would have refused; the counts stay the honest record, past the ceiling.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observe_mode_spends_every_window_and_names_the_one_that_would_refuse(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    let windows = json!([{"period": "1m", "ceiling": 2}, {"period": "1h", "ceiling": 100}]);
    stacked(&app, "llm", windows, "draft", "observe").await;
    let decisions = [
        app.reserve(json!({"flow": "draft", "count": 2})).await,
        app.reserve(json!({"flow": "draft"})).await,
    ];
    assert!(decisions.iter().all(|d| d.outcome == Outcome::Granted));
    assert!(!decisions[0].would_defer);
    assert!(decisions[1].would_defer);
    assert_eq!(decisions[1].period.as_deref(), Some("1m"));
    let spent: Vec<i64> = counts(&pool, "llm")
        .await
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(spent, [3, 3]);
}

/// Every surface refuses what is not a window, with a 422 naming it; a
/// quota's windows read back as written, and `hourly_ceiling` is its hour.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_api_takes_windows_and_refuses_what_is_not_one(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    for (windows, why) in [
        (json!([{"period": "7m", "ceiling": 5}]), "divide a day"),
        (
            json!([{"period": "1d", "ceiling": 5, "zone": "Mars/Olympus_Mons"}]),
            "time zone",
        ),
        (
            json!([{"period": "1h", "ceiling": 5, "zone": "Europe/Paris"}]),
            "zone",
        ),
        (
            json!([{"period": "1m", "ceiling": 5}, {"period": "60s", "ceiling": 6}]),
            "twice",
        ),
        (json!([{"period": "1m", "ceiling": -1}]), "between 0"),
    ] {
        let response = app
            .admin(Method::PUT, "/v1/quotas/bad")
            .json(&json!({ "windows": windows }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{windows}");
        let problem: Value = response.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(why), "{windows}: {detail}");
    }
    let written = json!([
        {"period": "1m", "ceiling": 500},
        {"period": "1d", "ceiling": 10000, "zone": "America/Los_Angeles"},
    ]);
    let put = app
        .admin_json(
            Method::PUT,
            "/v1/quotas/llm",
            Some(json!({"windows": written, "hourly_ceiling": 3000})),
        )
        .await;
    assert_eq!(
        put["windows"],
        json!([
            {"period": "1m", "ceiling": 500},
            {"period": "1h", "ceiling": 3000},
            {"period": "1d", "ceiling": 10000, "zone": "America/Los_Angeles"},
        ])
    );
    assert_eq!(put["hourly_ceiling"], 3000);
    let patched = app
        .admin_json(
            Method::PATCH,
            "/v1/quotas/llm",
            Some(json!({"hourly_ceiling": null})),
        )
        .await;
    assert_eq!(patched["hourly_ceiling"], Value::Null);
    assert_eq!(patched["windows"].as_array().unwrap().len(), 2);
    let stored: Option<i64> =
        sqlx::query_scalar("SELECT hourly_ceiling FROM quota WHERE name = 'llm'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, None, "the column follows the hour");
}

/// The CLI writes windows as `PERIOD=CEILING[@ZONE]`, and SQL that sets
/// `hourly_ceiling` sets the hour the decisions read.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_cli_writes_windows_and_sql_hourly_ceiling_is_the_hour(pool: PgPool) {
    let out = cli(
        &pool,
        &[
            "quota",
            "llm",
            "--window",
            "1m=500",
            "--window",
            "1d=10000@America/Los_Angeles",
        ],
    )
    .await;
    let printed = stdout(&out);
    assert!(
        printed.contains("windows=1m=500,1d=10000@America/Los_Angeles"),
        "{printed}"
    );
    let refused = cli(&pool, &["quota", "llm", "--window", "7m=5"]).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("divide a day"));

    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    sqlx::query("UPDATE quota SET hourly_ceiling = 1 WHERE name = 'ppf'")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    assert_eq!(
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        Outcome::Granted
    );
    let refused = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(
        (refused.outcome, refused.period.as_deref()),
        (Outcome::Deferred, Some("1h"))
    );
}

/// The statement alone is all or nothing across a quota's windows: with
/// room in the minute and none in the hour, it takes nothing from either
/// (rationing would refuse such a take too, but the statement never
/// relies on it).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_take_spends_every_window_or_none(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    sqlx::query("INSERT INTO quota (name) VALUES ('llm')")
        .execute(&pool)
        .await
        .unwrap();
    let store = Store::new(pool.clone());
    let minute = WindowRule {
        period: Period::parse("1m").unwrap(),
        ceiling: 5,
        zone: None,
    };
    let ask = |wanted| QuotaAsk {
        quota: "llm".into(),
        windows: vec![minute.clone(), WindowRule::hour(3)],
        share: None,
        wanted,
        smallest: wanted,
    };
    let first = store.take_slots_across(&[ask(2)], false).await.unwrap();
    assert_eq!(first[0].taken, 2);
    let second = store.take_slots_across(&[ask(2)], false).await.unwrap();
    assert_eq!(
        second[0].taken, 0,
        "the hour has 1 left: nothing from the minute either"
    );
    let before: Vec<i64> = second[0].windows.iter().map(|w| w.count_before).collect();
    assert_eq!(before, [2, 2]);
    assert_eq!(
        counts(&pool, "llm").await,
        [("1m".into(), 2), ("1h".into(), 2)]
    );
    let third = store.take_slots_across(&[ask(1)], false).await.unwrap();
    assert_eq!(third[0].taken, 1);
    assert_eq!(
        counts(&pool, "llm").await,
        [("1m".into(), 3), ("1h".into(), 3)]
    );
}
