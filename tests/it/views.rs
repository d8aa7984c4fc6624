//! What operators read: the `quota_cadence` view, and a flow's mode as the
//! dashboard and the `flows` command show it.

use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{cli, stdout};
use crate::helpers::{create_flow, metrics_text, set_limits, TestApp};

/// A `quota_cadence` row: quota, effective_rate, tokens_now, max_in_flight, leases_held.
type CadenceRow = (String, Option<f64>, Option<f64>, Option<i32>, i64);

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn quota_cadence_lists_quotas_with_only_concurrency_slots(pool: PgPool) {
    create_flow(&pool, "paced", 100, "sync", "enforce").await;
    set_limits(&pool, "paced", "rate = 2, burst = 4").await;
    create_flow(&pool, "slots", 100, "invoice", "enforce").await;
    set_limits(&pool, "slots", "max_in_flight = 3").await;
    create_flow(&pool, "plain", 100, "status-report", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let decision = app.reserve(json!({"flow": "invoice"})).await;
    assert!(decision.lease_id.is_some(), "{decision:?}");

    let rows: Vec<CadenceRow> = sqlx::query_as(
        "SELECT quota, effective_rate, tokens_now, max_in_flight, leases_held
         FROM quota_cadence ORDER BY quota",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows.len(),
        2,
        "a quota with neither limit is not listed: {rows:?}"
    );
    let (quota, rate, tokens, max_in_flight, leases) = &rows[0];
    assert_eq!(quota, "paced");
    assert_eq!((*rate, *max_in_flight, *leases), (Some(2.0), None, 0));
    assert!(
        tokens.is_some_and(|t| (3.9..=4.0).contains(&t)),
        "{tokens:?}"
    );
    assert_eq!(
        rows[1],
        ("slots".to_string(), None, None, Some(3), 1),
        "no cadence columns without a bucket, and the lease the grant holds"
    );
    // The cadence gauges read this view: a quota without cadence has none.
    let metrics = metrics_text(&app.client, &app.base).await;
    assert!(
        metrics.contains(r#"quota_arbiter_cadence_effective_rate{quota="paced"} 2"#),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"quota_arbiter_cadence_effective_rate{quota="slots"}"#),
        "{metrics}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_partly_enforced_flow_shows_its_percent_and_other_modes_none(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 10, "ack", "enforce").await;
    create_flow(&pool, "ppf", 10, "sync", "observe").await;
    // sync keeps the percent it had before it was flipped back to observe.
    sqlx::query("UPDATE flow SET enforce_percent = 25 WHERE name IN ('invoice', 'sync')")
        .execute(&pool)
        .await
        .unwrap();

    let app = TestApp::spawn(pool.clone()).await;
    let page = app.get("/").send().await.unwrap().text().await.unwrap();
    for (flow, shown) in [
        (
            "invoice",
            r#"<span class="mode enforce">enforce 25%</span>"#,
        ),
        ("ack", r#"<span class="mode enforce">enforce</span>"#),
        ("sync", r#"<span class="mode observe">observe</span>"#),
    ] {
        let row = page
            .split(&format!(r#"<tr data-flow="{flow}">"#))
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .unwrap_or_else(|| panic!("no row for {flow} in {page}"));
        assert!(row.contains(shown), "{flow}: {row}");
    }

    let flows = stdout(&cli(&pool, &["flows"]).await);
    let percent_of = |flow: &str| {
        flows
            .lines()
            .find(|line| line.split_whitespace().next() == Some(flow))
            // flow, quota, mode, priority, enforce%, fallback
            .and_then(|line| line.split_whitespace().nth(4))
            .unwrap_or_else(|| panic!("no {flow} in {flows}"))
            .to_string()
    };
    assert_eq!(
        [percent_of("invoice"), percent_of("ack"), percent_of("sync")],
        ["25", "100", "-"],
        "{flows}"
    );
}
