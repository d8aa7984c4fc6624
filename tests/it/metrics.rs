//! The metrics exposition: one format (Prometheus text 0.0.4) under its own
//! content type, family names equal to their samples, labelled counters there
//! from start-up, and `promtool check metrics` satisfied on a live replica.

use std::collections::BTreeMap;
use std::process::Stdio;

use quota_arbiter::domain::admission::RouteClassSettings;
use quota_arbiter::domain::catalog::{FlowRule, Mode};
use quota_arbiter::domain::decision::{Decision, Outcome};
use quota_arbiter::metrics::{Metrics, PoolReading, STORE_OPERATIONS};
use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;
use tokio::io::AsyncWriteExt;

use crate::helpers::{create_flow, find_on_path, pool_of, test_config, TestApp};

/// What is wrong with an exposition in the Prometheus text format: every
/// sample belongs to the family its `# TYPE` line names (histograms: `_bucket`,
/// `_sum`, `_count`), `# HELP` names the same family, a counter family ends in
/// `_total`, no family is declared twice, and no OpenMetrics `# EOF`.
fn exposition_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let mut help: Option<String> = None;
    for line in text.lines() {
        if line == "# EOF" {
            problems.push("`# EOF` is OpenMetrics, not Prometheus text 0.0.4".into());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split(' ').next().map(str::to_string);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, ""));
            if help.take().as_deref() != Some(name) {
                problems.push(format!("`# TYPE {name}` has no `# HELP {name}` before it"));
            }
            if kind == "counter" && !name.ends_with("_total") {
                problems.push(format!("counter `{name}` does not end in _total"));
            }
            if declared.insert(name.into(), kind.into()).is_some() {
                problems.push(format!("`{name}` is declared twice"));
            }
            current = Some((name.to_string(), kind.to_string()));
        } else if line.starts_with('#') || line.is_empty() {
            problems.push(format!("unexpected line `{line}`"));
        } else {
            let sample = line.split(['{', ' ']).next().unwrap_or_default();
            let belongs = current.as_ref().is_some_and(|(family, kind)| {
                let suffixes: &[&str] = match kind.as_str() {
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                suffixes
                    .iter()
                    .any(|suffix| sample == format!("{family}{suffix}"))
            });
            if !belongs {
                problems.push(format!(
                    "sample `{sample}` is not of the family declared before it ({current:?})"
                ));
            }
        }
    }
    problems
}

/// `promtool check metrics` on `text`: what it printed, or `None` (with a
/// message) when promtool is not installed.
async fn promtool_check(test: &str, text: &str) -> Option<Result<(), String>> {
    let Some(promtool) = find_on_path(&["promtool"]) else {
        eprintln!("SKIPPED promtool in {test}: no promtool on PATH (.ci/run installs Debian's prometheus)");
        return None;
    };
    let mut child = tokio::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Lint findings make promtool exit non-zero and print one line each.
    Some(if output.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(said)
    })
}

/// GET /metrics: the body, after checking the content type says its format
/// and the body is valid in that format (for promtool too, when installed).
async fn valid_scrape(app: &TestApp, test: &str) -> String {
    let response = app.get("/metrics").send().await.expect("request sent");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = response.text().await.unwrap();
    let problems = exposition_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}\n{text}");
    if let Some(checked) = promtool_check(test, &text).await {
        checked.unwrap_or_else(|said| panic!("promtool check metrics:\n{said}\n{text}"));
    }
    text
}

pub(crate) fn sample<'t>(text: &'t str, series: &str) -> Option<&'t str> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
}

fn flow(name: &str, mode: Mode) -> FlowRule {
    FlowRule {
        name: name.into(),
        quota: "ppf".into(),
        further_quotas: Vec::new(),
        mode,
        priority: 2,
        enforce_percent: 100,
    }
}

#[tokio::test]
async fn every_family_is_named_like_its_samples_and_counters_start_at_zero() {
    let metrics = Metrics::new();
    let mut observed = Decision::new(Outcome::Granted, "status-report");
    observed.quota = Some("ppf".into());
    observed.mode = Some(Mode::Observe);
    observed.would_defer = true;
    metrics.record_decision(&observed, true);
    metrics.record_decision(&Decision::new(Outcome::Unthrottled, "nobody"), false);
    metrics.record_reserve_seconds(0.003);
    metrics.store_error("reserve");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let partly = FlowRule {
        enforce_percent: 25,
        ..flow("ack", Mode::Enforce)
    };
    let flipped_back = FlowRule {
        enforce_percent: 25,
        ..flow("sync", Mode::Observe)
    };
    let flows = [flow("invoice", Mode::Enforce), partly, flipped_back];
    metrics.set_state(&flows, None, reading(&pool));
    let text = metrics.encode();

    let problems = exposition_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}\n{text}");
    for operation in STORE_OPERATIONS {
        let series = format!(r#"quota_arbiter_store_errors_total{{operation="{operation}"}}"#);
        let want = if *operation == "reserve" { "1" } else { "0" };
        assert_eq!(sample(&text, &series), Some(want), "{series}\n{text}");
    }
    for (series, want) in [
        // A flow of the catalog, in every mode it could be flipped to.
        (
            r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="deferred",mode="enforce"}"#,
            "0",
        ),
        (
            r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="granted",mode="observe"}"#,
            "0",
        ),
        (
            r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="unthrottled",mode="count"}"#,
            "0",
        ),
        (
            r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="bypassed",mode="enforce"}"#,
            "0",
        ),
        (
            r#"quota_arbiter_would_defer_total{quota="ppf",flow="invoice",outcome="granted",mode="observe"}"#,
            "0",
        ),
        (
            r#"quota_arbiter_decisions_total{quota="",flow="_unknown",outcome="bypassed",mode=""}"#,
            "0",
        ),
        (
            r#"quota_arbiter_decisions_total{quota="",flow="_unknown",outcome="unthrottled",mode=""}"#,
            "1",
        ),
        (
            r#"quota_arbiter_would_defer_total{quota="ppf",flow="status-report",outcome="granted",mode="observe"}"#,
            "1",
        ),
        ("quota_arbiter_reserve_duration_seconds_count", "1"),
        (
            r#"quota_arbiter_flow_enforce_percent{flow="invoice",quota="ppf"}"#,
            "100",
        ),
        (
            r#"quota_arbiter_flow_enforce_percent{flow="ack",quota="ppf"}"#,
            "25",
        ),
        (
            r#"quota_arbiter_flow_enforce_percent{flow="sync",quota="ppf"}"#,
            "0",
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series}\n{text}");
    }
}

/// What a scrape reads of `pool` (`Administration`'s reading of its store's).
fn reading(pool: &PgPool) -> PoolReading {
    PoolReading {
        open: pool.size(),
        idle: pool.num_idle(),
        max: pool.options().get_max_connections(),
    }
}

/// The pool's gauges say what it holds at the scrape: connections handed out
/// and connections idle, which together are the pool's size.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_pool_gauges_count_connections_in_use_and_idle(pool: PgPool) {
    // A pool of its own, so that nothing else holds or keeps a connection.
    let pool = pool_of(&pool, 3).await;
    let held = pool.acquire().await.unwrap();
    let returned = pool.acquire().await.unwrap();
    drop(returned);
    // Idle once the pool has taken it back.
    while pool.num_idle() < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(pool.size(), 2);
    let metrics = Metrics::new();
    metrics.set_state(&[], None, reading(&pool));
    let text = metrics.encode();
    for (series, want) in [
        (r#"quota_arbiter_db_pool_connections{state="in_use"}"#, "1"),
        (r#"quota_arbiter_db_pool_connections{state="idle"}"#, "1"),
        ("quota_arbiter_db_pool_max_connections", "3"),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series}\n{text}");
    }
    drop(held);
}

#[test]
fn the_checker_finds_what_it_is_meant_to_find() {
    let open_metrics = "# HELP qa_decisions Decisions.\n# TYPE qa_decisions counter\nqa_decisions_total 1\n# EOF\n";
    let problems = exposition_problems(open_metrics);
    assert_eq!(problems.len(), 3, "{problems:#?}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_freshly_started_replica_exposes_a_valid_exposition(pool: PgPool) {
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    // A route class of the catalog: its admissions are series from the
    // first scrape, before anyone was admitted.
    let mut config = test_config();
    let partners = RouteClassSettings {
        burst: 20.0,
        rate: 5.0,
        capacity: 600,
        window_seconds: 60,
        tenant_share: 0.5,
        capacity_error_budget: 0.01,
    };
    config.route_classes = [("partners".to_string(), partners)].into();
    let app = TestApp::spawn_with(pool, config).await;
    let text = valid_scrape(&app, "a_freshly_started_replica_exposes_a_valid_exposition").await;
    let admissions = [
        "admitted",
        "caller_rate_limited",
        "capacity_exhausted",
        "store_unavailable",
    ]
    .map(|outcome| format!(r#"quota_admit_total{{route_class="partners",outcome="{outcome}"}}"#));
    let series = [
        r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="granted",mode="enforce"}"#,
        r#"quota_arbiter_decisions_total{quota="",flow="_unknown",outcome="unthrottled",mode=""}"#,
        r#"quota_arbiter_store_errors_total{operation="reserve"}"#,
        "quota_arbiter_claim_wait_seconds_count",
    ];
    for series in series
        .iter()
        .copied()
        .chain(admissions.iter().map(String::as_str))
    {
        assert_eq!(sample(&text, series), Some("0"), "{series}\n{text}");
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_replica_that_served_every_kind_of_traffic_exposes_a_valid_exposition(pool: PgPool) {
    create_flow(&pool, "ppf", 3, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 3, "status-report", "observe").await;
    create_flow(&pool, "ppf", 3, "audit-log", "count").await;
    create_flow(&pool, "partner", 100, "sync", "enforce").await;
    crate::helpers::set_limits(&pool, "partner", "rate = 50, burst = 5, max_in_flight = 2").await;
    let app = TestApp::spawn(pool.clone()).await;
    let soon: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT arbiter_now() + interval '1 minute'")
            .fetch_one(&pool)
            .await
            .unwrap();

    let mut outcomes = Vec::new();
    for body in [
        json!({"flow": "invoice"}),
        json!({"flow": "invoice", "count": 3}), // deferred: 1 + 3 > 3
        json!({"flow": "status-report", "count": 3}), // would defer
        json!({"flow": "audit-log"}),
        json!({"flow": "nobody"}),
        json!({"flow": "invoice", "deadline": soon}),
        json!({"flow": "sync"}),
    ] {
        outcomes.push(app.reserve(body).await.outcome);
    }
    use Outcome::*;
    assert_eq!(
        outcomes,
        [
            Granted,
            Deferred,
            Granted,
            Unthrottled,
            Unthrottled,
            Bypassed,
            Granted
        ]
    );
    app.post_json(
        "/v1/reserve/batch",
        json!({"items": [
            {"ref": "b1", "flow": "invoice"},
            {"ref": "b2", "flow": "status-report"},
            {"ref": "b3", "flow": "nobody"}]}),
    )
    .await;
    let enqueued = app
        .post("/v1/work")
        .json(&json!({"flow": "status-report", "payload": {"n": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(enqueued.status(), 201);
    let claim = app
        .post_json("/v1/work/claim", json!({"worker": "w-1"}))
        .await;
    assert_eq!(claim["outcome"], "claimed", "{claim}");
    app.post_json("/v1/report", json!({"flow": "sync", "status": 429}))
        .await;
    app.admin_json(Method::GET, "/v1/report?since=1d", None)
        .await;

    let text = valid_scrape(
        &app,
        "a_replica_that_served_every_kind_of_traffic_exposes_a_valid_exposition",
    )
    .await;
    for series in [
        r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="deferred",mode="enforce"}"#,
        r#"quota_arbiter_decisions_total{quota="ppf",flow="invoice",outcome="bypassed",mode="enforce"}"#,
        r#"quota_arbiter_would_defer_total{quota="ppf",flow="status-report",outcome="granted",mode="observe"}"#,
        r#"quota_arbiter_cadence_effective_rate{quota="partner"}"#,
    ] {
        let value: f64 = sample(&text, series)
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap();
        assert!(value > 0.0, "{series} {value}");
    }
}
