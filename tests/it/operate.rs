//! Operating the arbiter: flips obeyed everywhere within a second, the audit
//! trail, gradual enforcement, the CLI, the report and the SQL views.

use std::time::{Duration, Instant};

use quota_arbiter::domain::decision::{Decision, Outcome};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    cli, cli_with_env, create_flow, database_url, eventually, metrics_text, post_reserve,
    postgres_host_port, stdout, Replica, TestApp,
};

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn two_replicas_obey_a_raw_sql_flip_within_a_second(pool: PgPool) {
    create_flow(&pool, "closed", 0, "invoice", "observe").await;
    let url = database_url(&pool, &postgres_host_port()).await;
    let replicas = [Replica::spawn(&url).await, Replica::spawn(&url).await];
    let client = reqwest::Client::new();
    for replica in &replicas {
        let decision: Decision = post_reserve(&client, &replica.base, json!({"flow": "invoice"}))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(decision.outcome, Outcome::Granted, "observe grants");
    }

    sqlx::query("UPDATE flow SET mode = 'enforce' WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    let flipped_at = Instant::now();
    for replica in &replicas {
        let outcome = eventually(Duration::from_secs(3), Outcome::Deferred, || async {
            post_reserve(&client, &replica.base, json!({"flow": "invoice"}))
                .await
                .json::<Decision>()
                .await
                .unwrap()
                .outcome
        })
        .await;
        assert_eq!(
            outcome,
            Outcome::Deferred,
            "{} obeys the flip",
            replica.base
        );
    }
    let took = flipped_at.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "both replicas obeyed after {took:?}"
    );

    let audit: (String, String, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT actor, field, from_value, to_value FROM catalog_audit
         WHERE entity = 'flow' AND name = 'invoice' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let role: String = sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        audit,
        (
            format!("sql:{role}"),
            "mode".into(),
            Some("observe".into()),
            Some("enforce".into())
        )
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn api_and_cli_flips_are_audited_with_who_made_them(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let response = app
        .admin(Method::PUT, "/v1/flows/invoice")
        .json(&json!({"quota": "ppf", "mode": "enforce", "create_quota": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let flipped = stdout(&cli(&pool, &["flow", "invoice", "observe"]).await);
    assert!(
        flipped.contains("invoice") && flipped.contains("observe"),
        "{flipped}"
    );
    stdout(&cli(&pool, &["quota", "ppf", "--hourly-ceiling", "250"]).await);

    let trail: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT actor, field, from_value, to_value FROM catalog_audit
         WHERE field IN ('mode', 'hourly_ceiling') ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        trail,
        vec![
            (
                "api:admin".into(),
                "hourly_ceiling".into(),
                None,
                Some("1000".into())
            ),
            (
                "api:admin".into(),
                "mode".into(),
                None,
                Some("enforce".into())
            ),
            (
                "cli:alice".into(),
                "mode".into(),
                Some("enforce".into()),
                Some("observe".into())
            ),
            (
                "cli:alice".into(),
                "hourly_ceiling".into(),
                Some("1000".into()),
                Some("250".into())
            ),
        ]
    );
    let flows = stdout(&cli(&pool, &["flows"]).await);
    assert!(
        flows
            .lines()
            .any(|l| l.starts_with("invoice") && l.contains("ppf") && l.contains("observe")),
        "{flows}"
    );
    let unknown = cli(&pool, &["flow", "nope", "enforce"]).await;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--quota"));
}

/// A shell without `USER` (or with it empty) and without `LOGNAME`, as under
/// cron or a container's entrypoint: the audit trail names the account the
/// command ran as, not `unknown`.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_cli_change_without_a_user_variable_names_the_account(pool: PgPool) {
    let args = ["quota", "ppf", "--hourly-ceiling", "300"];
    stdout(&cli_with_env(&pool, &args, &[("USER", "")]).await);
    let id = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let account = String::from_utf8(id.stdout).unwrap().trim().to_string();
    assert!(!account.is_empty());
    let actor: String = sqlx::query_scalar(
        "SELECT actor FROM catalog_audit WHERE field = 'hourly_ceiling' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(actor, format!("cli:{account}"));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn gradual_enforcement_defers_its_share_deterministically_per_ref(pool: PgPool) {
    create_flow(&pool, "ppf", 1, "invoice", "enforce").await;
    sqlx::query("UPDATE flow SET enforce_percent = 30 WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    assert_eq!(
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        Outcome::Granted
    );

    // Without a ref, refusals are spread exactly over the share.
    let mut deferred = 0;
    for _ in 0..100 {
        let decision = app.reserve(json!({"flow": "invoice"})).await;
        if decision.outcome == Outcome::Deferred {
            deferred += 1;
        } else {
            assert_eq!(decision.outcome, Outcome::Granted);
            assert!(decision.would_defer, "granted as observed");
        }
    }
    assert_eq!(deferred, 30);

    // With a ref, the same ref always gets the same answer.
    let mut first = Vec::new();
    for i in 0..200 {
        first.push(
            app.reserve(json!({"flow": "invoice", "ref": format!("inv-{i}")}))
                .await
                .outcome,
        );
    }
    let share = first.iter().filter(|o| **o == Outcome::Deferred).count();
    assert!(
        (40..=80).contains(&share),
        "about 30% of 200 refs deferred, got {share}"
    );
    for (i, outcome) in first.iter().enumerate().take(50) {
        let again = app
            .reserve(json!({"flow": "invoice", "ref": format!("inv-{i}")}))
            .await
            .outcome;
        assert_eq!(
            again, *outcome,
            "inv-{i} is decided the same way every time"
        );
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn report_views_and_tallies_agree_on_a_known_load(pool: PgPool) {
    let pool = crate::helpers::pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "status-report", "observe").await;
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let far: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT arbiter_now() + interval '50 minutes'")
            .fetch_one(&pool)
            .await
            .unwrap();
    // 5 fit, then 7 over the ceiling, all 7 carrying a (distant) deadline.
    for _ in 0..5 {
        app.reserve(json!({"flow": "status-report"})).await;
    }
    for _ in 0..7 {
        assert!(
            app.reserve(json!({"flow": "status-report", "deadline": far}))
                .await
                .would_defer
        );
    }
    let soon = far - chrono::Duration::minutes(45);
    assert_eq!(
        app.reserve(json!({"flow": "invoice", "deadline": soon}))
            .await
            .outcome,
        Outcome::Bypassed
    );

    let tallied = eventually(Duration::from_secs(5), (12, 7, 7), || async {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT coalesce(sum(granted), 0)::bigint, coalesce(sum(would_defer), 0)::bigint,
                    coalesce(sum(would_defer_with_deadline), 0)::bigint
             FROM decision_tally WHERE flow = 'status-report'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert_eq!(tallied, (12, 7, 7));

    let report: Value = app
        .admin_json(Method::GET, "/v1/report?since=7d", None)
        .await;
    let flows = report["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 1, "only flows still observing: {report}");
    let flow = &flows[0];
    assert_eq!(
        (flow["flow"].as_str(), flow["would_defer"].as_i64()),
        (Some("status-report"), Some(7))
    );
    assert_eq!(flow["would_defer_with_deadline"], 7);
    assert_eq!(flow["hours_with_deferrals"], 1);
    let verdict = flow["verdict"].as_str().unwrap();
    assert!(verdict.starts_with("enforcing status-report now would have deferred 7 decisions in 1 of the last 168 hours (worst: "), "{verdict}");

    let what_if: Value = app
        .admin_json(Method::GET, "/v1/report?since=1d&ceiling=10", None)
        .await;
    // 13 slots in the window (12 observed + 1 bypass) against a ceiling of 10;
    // status-report made 12 of the hour's 13 decisions.
    assert_eq!(what_if["flows"][0]["would_defer"], 3, "{what_if}");
    assert_eq!(what_if["since_hours"], 24);

    let cli_report = stdout(&cli(&pool, &["report", "--since", "7d"]).await);
    assert!(cli_report.contains(verdict), "{cli_report}");

    let view: (i64, i64) = sqlx::query_as(
        "SELECT sum(would_defer)::bigint, sum(would_defer_with_deadline)::bigint FROM observe_would_defer WHERE flow = 'status-report'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(view, (7, 7));
    let usage: (i64, i64, i64) = sqlx::query_as(
        "SELECT count, hourly_ceiling, slots_left FROM quota_usage WHERE quota = 'ppf'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(usage, (13, 5, 0));
    let recent: (i64, i64, i64, bool) = sqlx::query_as(
        "SELECT granted, would_defer, bypassed, over_ceiling FROM quota_recent_windows WHERE quota = 'ppf'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recent, (12, 7, 1, true));
    let bypasses: i64 = sqlx::query_scalar(
        "SELECT sum(bypassed)::bigint FROM bypasses_by_hour WHERE flow = 'invoice'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(bypasses, 1);
    let windows = stdout(&cli(&pool, &["windows", "--quota", "ppf"]).await);
    assert!(
        windows
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("ppf") && l.contains(" 13 ")),
        "{windows}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn metrics_expose_modes_usage_and_pool(pool: PgPool) {
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool).await;
    app.reserve(json!({"flow": "invoice"})).await;
    let text = metrics_text(&app.client, &app.base).await;
    for line in [
        r#"quota_arbiter_flow_mode{flow="invoice",quota="ppf",mode="enforce"} 1"#,
        r#"quota_arbiter_flow_mode{flow="invoice",quota="ppf",mode="observe"} 0"#,
        r#"quota_arbiter_window_slots_spent{quota="ppf",period="1h"} 1"#,
        r#"quota_arbiter_window_ceiling{quota="ppf",period="1h"} 5"#,
        r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="granted",mode="enforce"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    assert!(
        text.contains("quota_arbiter_db_pool_max_connections "),
        "{text}"
    );
    assert!(text.contains(r#"quota_arbiter_db_pool_connections{state="in_use"}"#));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_operator_query_runs(pool: PgPool) {
    create_flow(&pool, "ppf", 5, "invoice", "observe").await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/inspect");
    let mut ran = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("-- "),
            "{} says what question it answers",
            path.display()
        );
        sqlx::raw_sql(&text)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        ran += 1;
    }
    assert!(ran >= 8, "only {ran} operator queries");
}
