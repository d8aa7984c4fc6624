//! The observe-mode report: its what-if estimate against the plain report.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{cli, create_flow, eventually, pin_clock, stdout, TestApp};

/// Would-defers per flow, as a report lists them.
fn would_defer_by_flow(report: &Value) -> Vec<(String, i64)> {
    report["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let flow = f["flow"].as_str().unwrap().to_string();
            (flow, f["would_defer"].as_i64().unwrap())
        })
        .collect()
}

/// The report over the last day, with `query` (`&ceiling=5`, …) added.
async fn report_of(app: &TestApp, query: &str) -> Value {
    app.admin_json(Method::GET, &format!("/v1/report?since=1d{query}"), None)
        .await
}

/// Decisions and would-defers tallied, once the flush wrote `want` (or 5 s).
async fn tallied(pool: &PgPool, want: (i64, i64)) -> (i64, i64) {
    eventually(Duration::from_secs(5), want, || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT coalesce(sum(granted), 0)::bigint, coalesce(sum(would_defer), 0)::bigint
             FROM decision_tally",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    })
    .await
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_what_if_at_the_quotas_own_ceiling_is_the_plain_report(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "sync", "observe").await;
    create_flow(&pool, "ppf", 5, "status-report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    // sync fits early (4 slots); status-report takes the 5th, then three
    // decisions of several slots each go over the ceiling: 12 slots in all.
    for _ in 0..4 {
        assert!(!app.reserve(json!({"flow": "sync"})).await.would_defer);
    }
    assert!(
        !app.reserve(json!({"flow": "status-report"}))
            .await
            .would_defer
    );
    for count in [2, 2, 3] {
        let decision = app
            .reserve(json!({"flow": "status-report", "count": count}))
            .await;
        assert!(decision.would_defer);
    }
    assert_eq!(tallied(&pool, (8, 3)).await, (8, 3));

    let report = |query: &'static str| report_of(&app, query);
    let plain = report("").await;
    let expected = vec![("status-report".to_string(), 3), ("sync".to_string(), 0)];
    assert_eq!(would_defer_by_flow(&plain), expected, "{plain}");
    let at_own_ceiling = report("&ceiling=5").await;
    assert_eq!(
        would_defer_by_flow(&at_own_ceiling),
        expected,
        "the quota's real ceiling is no what-if: {at_own_ceiling}"
    );
    assert_eq!(
        plain["flows"][0]["hours"], at_own_ceiling["flows"][0]["hours"],
        "hour by hour too"
    );
    // Running counts 1..4 (sync), then 5, 7, 9, 12 (status-report): at 8 the
    // last two are over, at 12 none is, at 0 every decision is.
    assert_eq!(
        would_defer_by_flow(&report("&ceiling=8").await),
        [("status-report".to_string(), 2), ("sync".to_string(), 0)]
    );
    assert_eq!(
        would_defer_by_flow(&report("&ceiling=12").await),
        [("status-report".to_string(), 0), ("sync".to_string(), 0)]
    );
    assert_eq!(
        would_defer_by_flow(&report("&ceiling=0").await),
        [("status-report".to_string(), 4), ("sync".to_string(), 4)]
    );
    // A report for one quota leaves out the flows observing another.
    create_flow(&pool, "other", 5, "elsewhere", "observe").await;
    let everyone = would_defer_by_flow(&report("").await);
    assert!(
        everyone.contains(&("elsewhere".to_string(), 0)),
        "{everyone:?}"
    );
    assert_eq!(would_defer_by_flow(&report("&quota=ppf").await), expected);
}

/// The report per window (design.md §12): every window of a quota with how
/// often and by how much it went over, and a what-if per period estimated
/// from every window's count (exact here: one flow, one slot a decision).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_report_and_its_what_if_cover_every_window(pool: PgPool) {
    let minute_ten = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(minute_ten).await;
    let windows = json!([{"period": "1m", "ceiling": 3}, {"period": "1h", "ceiling": 10}]);
    app.admin_json(
        Method::PUT,
        "/v1/quotas/llm",
        Some(json!({ "windows": windows })),
    )
    .await;
    let flow = json!({"quota": "llm", "mode": "observe"});
    app.admin_json(Method::PUT, "/v1/flows/chat", Some(flow))
        .await;
    // Minute 10 counts 5 (the 4th and 5th over its 3), minute 11 counts 4
    // (the 4th over); the hour counts 9 of its 10.
    let mut would_defer = Vec::new();
    for _ in 0..5 {
        would_defer.push(app.reserve(json!({"flow": "chat"})).await.would_defer);
    }
    let app = TestApp::spawn(pin_clock(&pool, 11).await).await;
    for _ in 0..4 {
        would_defer.push(app.reserve(json!({"flow": "chat"})).await.would_defer);
    }
    let over = [false, false, false, true, true, false, false, false, true];
    assert_eq!(would_defer, over);
    assert_eq!(tallied(&pool, (9, 3)).await, (9, 3));

    let report = |query: &'static str| report_of(&app, query);
    let plain = report("").await;
    let windows = &plain["flows"][0]["windows"];
    let summary = |w: &Value| {
        let numbers = ["windows", "windows_over", "slots_over"].map(|k| w[k].as_i64().unwrap());
        (
            w["period"].as_str().unwrap().to_string(),
            numbers,
            w["fullest"]["count"].as_i64().unwrap(),
        )
    };
    assert_eq!(
        summary(&windows[0]),
        ("1m".to_string(), [2, 2, 3], 5),
        "{plain}"
    );
    assert_eq!(
        summary(&windows[1]),
        ("1h".to_string(), [1, 0, 0], 9),
        "{plain}"
    );
    assert_eq!(would_defer_by_flow(&plain), [("chat".to_string(), 3)]);
    let chat = |report: Value| would_defer_by_flow(&report)[0].1;
    // The quota's own ceilings asked as a what-if: the tally, exactly.
    assert_eq!(chat(report("&what_if=1m=3,1h=10").await), 3);
    // A roomier minute: only the 5th of minute 10 is over 4; none over 10.
    let roomier = report("&what_if=1m=4").await;
    assert_eq!(chat(roomier.clone()), 1, "{roomier}");
    let minute = &roomier["flows"][0]["windows"][0];
    assert_eq!(minute["what_if_ceiling"], 4);
    assert_eq!(summary(minute), ("1m".to_string(), [2, 1, 1], 5));
    assert_eq!(chat(report("&what_if=1m=10").await), 0);
    // A tighter hour: the 4th to the 9th are over 3 (the minutes' own
    // ceilings defer no more than that); a zero minute defers everything.
    assert_eq!(chat(report("&what_if=1h=3").await), 6);
    assert_eq!(
        chat(report("&ceiling=3").await),
        6,
        "`ceiling` is the hour's"
    );
    assert_eq!(chat(report("&what_if=1m=0").await), 9);
    // A what-if changes a window's ceiling; it adds none, and names one once.
    for query in ["&what_if=1d=5", "&what_if=1h=3&ceiling=3", "&what_if=2h=9"] {
        let answer = app
            .admin(Method::GET, &format!("/v1/report?since=1d{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 422, "{query}");
    }
    let printed = stdout(&cli(&pool, &["report", "--quota", "llm", "--what-if", "1m=4"]).await);
    assert!(
        printed.contains("llm 1m (ceiling what-if 4, own 3): 1 of 2 windows over, 1 slots over"),
        "{printed}"
    );
}
