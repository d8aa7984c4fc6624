//! The observe-mode report: its what-if estimate against the plain report.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{create_flow, eventually, pin_clock, TestApp};

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
    let tallied = eventually(Duration::from_secs(5), (8, 3), || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT coalesce(sum(granted), 0)::bigint, coalesce(sum(would_defer), 0)::bigint
             FROM decision_tally",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(tallied, (8, 3));

    let report = |query: &'static str| {
        let app = &app;
        async move {
            app.admin_json(Method::GET, &format!("/v1/report?since=1d{query}"), None)
                .await
        }
    };
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
