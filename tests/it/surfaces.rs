//! One meaning on every operator surface: each row of the operator table in
//! docs/operations/runbook.md done through the API, the CLI and raw SQL leaves
//! the same rows; PUT replaces, PATCH and the CLI change what they name; typos
//! are refused.

use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{cli, cli_with_env, stdout, TestApp};

/// One row of the runbook's "Operator actions" table.
#[derive(Debug)]
struct Action {
    what: String,
    api: String,
    cli: String,
    sql: String,
}

/// The rows of the runbook's table, so that the book cannot drift from what
/// the surfaces do.
fn operator_actions() -> Vec<Action> {
    let runbook = include_str!("../../docs/operations/runbook.md");
    let table = runbook
        .split("\n## Operator actions\n")
        .nth(1)
        .expect("docs/operations/runbook.md has an Operator actions section");
    let code = |cell: &str| cell.trim().trim_matches('`').to_string();
    table
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // header and rule
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 4, "four columns: {line}");
            Action {
                what: cells[0].trim().to_string(),
                api: code(cells[1]),
                cli: code(cells[2]),
                sql: code(cells[3]),
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Surface {
    Api,
    Cli,
    Sql,
}

async fn perform(surface: Surface, action: &Action, app: &TestApp, pool: &PgPool) {
    match surface {
        Surface::Api => {
            let (method, rest) = action.api.split_once(' ').unwrap();
            let (path, body) = rest.split_once(' ').unwrap_or((rest, ""));
            let method: Method = method.parse().unwrap();
            // PUT sends the whole object, PATCH a merge patch.
            let content_type = if method == Method::PATCH {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            let mut request = app.admin(method, path);
            if !body.is_empty() {
                request = request
                    .header("content-type", content_type)
                    .body(body.to_string());
            }
            let response = request.send().await.unwrap();
            assert!(
                response.status().is_success(),
                "{}: {} answered {}",
                action.what,
                action.api,
                response.text().await.unwrap()
            );
        }
        Surface::Cli => {
            let args: Vec<&str> = action.cli.split_whitespace().skip(1).collect();
            stdout(&cli(pool, &args).await);
        }
        Surface::Sql => {
            sqlx::raw_sql(&action.sql).execute(pool).await.unwrap();
        }
    }
}

/// The catalog as rows, without the timestamps that differ between runs.
async fn catalog_rows(pool: &PgPool) -> Value {
    sqlx::query_scalar(
        "SELECT json_build_object(
            'quotas', (SELECT json_agg(to_jsonb(q) - 'created_at' - 'updated_at' ORDER BY name) FROM quota q),
            'flows', (SELECT json_agg(to_jsonb(f) - 'created_at' - 'updated_at' ORDER BY name) FROM flow f))",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_operator_action_means_the_same_through_api_cli_and_sql(pool: PgPool) {
    let actions = operator_actions();
    assert!(actions.len() >= 10, "{actions:?}");
    let app = TestApp::spawn(pool.clone()).await;
    let mut rows_by_surface = Vec::new();
    for surface in [Surface::Api, Surface::Cli, Surface::Sql] {
        sqlx::raw_sql("DELETE FROM flow; DELETE FROM quota;")
            .execute(&pool)
            .await
            .unwrap();
        let mut rows = Vec::new();
        for action in &actions {
            perform(surface, action, &app, &pool).await;
            rows.push(catalog_rows(&pool).await);
        }
        rows_by_surface.push((surface, rows));
    }
    let (_, api_rows) = &rows_by_surface[0];
    for (surface, rows) in &rows_by_surface[1..] {
        for ((action, api), other) in actions.iter().zip(api_rows).zip(rows) {
            assert_eq!(api, other, "{}: API and {surface:?} differ", action.what);
        }
    }
    // And what the rows say is what the runbook promises.
    let after = |what: &str| {
        let at = actions.iter().position(|a| a.what == what).unwrap();
        api_rows[at].clone()
    };
    let resized = after("change only the ceiling");
    let quota = &resized["quotas"][0];
    assert_eq!(
        (quota["hourly_ceiling"].as_i64(), quota["rate"].as_f64()),
        (Some(4000), Some(2.0)),
        "a ceiling change keeps the cadence"
    );
    let full = after("enforce fully");
    assert_eq!(full["flows"][0]["enforce_percent"], Value::Null);
    let back = after("roll back to observe");
    assert_eq!(
        (
            &back["flows"][0]["mode"],
            &back["flows"][0]["enforce_percent"]
        ),
        (&json!("observe"), &Value::Null)
    );
    let off = after("turn the cadence off");
    assert_eq!(
        (
            &off["quotas"][0]["rate"],
            &off["quotas"][0]["max_in_flight"]
        ),
        (&Value::Null, &json!(4))
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn put_replaces_the_whole_object_and_patch_only_what_it_names(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let limits = json!({"hourly_ceiling": 3600, "rate": 2, "burst": 20, "max_in_flight": 4});
    app.admin_json(Method::PUT, "/v1/quotas/partner-api", Some(limits))
        .await;
    let patched = app
        .admin_json(
            Method::PATCH,
            "/v1/quotas/partner-api",
            Some(json!({"hourly_ceiling": 4000})),
        )
        .await;
    assert_eq!(
        (&patched["rate"], &patched["max_in_flight"]),
        (&json!(2.0), &json!(4)),
        "PATCH keeps what it does not name: {patched}"
    );
    let cli_resized =
        stdout(&cli(&pool, &["quota", "partner-api", "--hourly-ceiling", "5000"]).await);
    assert!(cli_resized.contains("rate=2"), "{cli_resized}");
    let replaced = app
        .admin_json(
            Method::PUT,
            "/v1/quotas/partner-api",
            Some(json!({"hourly_ceiling": 4000})),
        )
        .await;
    assert_eq!(
        (&replaced["rate"], &replaced["max_in_flight"]),
        (&Value::Null, &Value::Null),
        "PUT replaces: {replaced}"
    );

    // A flow enforced at 30 % and flipped to enforce again, on every surface, is enforced fully.
    let flow = "/v1/flows/invoice";
    let partial = json!({"quota": "partner-api", "mode": "enforce", "enforce_percent": 30});
    for flip in [
        (
            Method::PUT,
            json!({"quota": "partner-api", "mode": "enforce"}),
        ),
        (Method::PATCH, json!({"mode": "enforce"})),
        (Method::PATCH, json!({"enforce_percent": null})),
    ] {
        app.admin_json(Method::PUT, flow, Some(partial.clone()))
            .await;
        let (method, body) = flip;
        let flipped = app
            .admin_json(method.clone(), flow, Some(body.clone()))
            .await;
        assert_eq!(flipped["enforce_percent"], Value::Null, "{method} {body}");
    }
    app.admin_json(Method::PUT, flow, Some(partial)).await;
    let printed = stdout(&cli(&pool, &["flow", "invoice", "enforce"]).await);
    assert!(printed.contains("enforce"), "{printed}");
    let percent: Option<i16> =
        sqlx::query_scalar("SELECT enforce_percent FROM flow WHERE name = 'invoice'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(percent, None, "the CLI flip enforces fully");

    // A percent outside enforce is refused, not stored.
    for body in [
        json!({"mode": "observe", "enforce_percent": 30}),
        json!({"mode": "count", "enforce_percent": 30}),
    ] {
        let response = app
            .admin(Method::PATCH, flow)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{body}");
    }
    let refused = cli(&pool, &["flow", "invoice", "observe", "--percent", "30"]).await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("enforce_percent"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn typos_are_refused_not_absorbed(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    app.admin_json(
        Method::PUT,
        "/v1/quotas/ppf",
        Some(json!({"hourly_ceiling": 100, "max_in_flight": 2})),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/invoice",
        Some(json!({"quota": "ppf", "mode": "enforce"})),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/ack",
        Some(json!({"quota": "ppf", "mode": "enforce"})),
    )
    .await;

    // A flow naming a quota that does not exist creates nothing: PUT names
    // the quota, PATCH (which changes only what exists) the flow.
    for (method, status, named) in [(Method::PUT, 422, "`pff`"), (Method::PATCH, 404, "`x`")] {
        let response = app
            .admin(method.clone(), "/v1/flows/x")
            .json(&json!({"quota": "pff"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{method}");
        let problem: Value = response.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains(named),
            "{problem}"
        );
    }
    let typo = cli(&pool, &["flow", "x", "--quota", "pff"]).await;
    assert!(!typo.status.success());
    let quotas: i64 = sqlx::query_scalar("SELECT count(*) FROM quota WHERE name = 'pff'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(quotas, 0, "no quota made from a typo");
    stdout(&cli(&pool, &["flow", "x", "--quota", "pff", "--create-quota"]).await);

    // Reports about a flow or quota nobody declared are 404s.
    for body in [
        json!({"flow": "nosuchflow", "status": 429}),
        json!({"quota": "nosuch", "status": 429}),
    ] {
        let response = app.post("/v1/report").json(&body).send().await.unwrap();
        assert_eq!(response.status(), 404, "{body}");
    }
    for path in [
        "/v1/report?quota=nosuch",
        "/v1/windows?quota=nosuch",
        "/v1/flows/nosuch",
    ] {
        let response = app.admin(Method::GET, path).send().await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
    }
    let report = cli(&pool, &["report", "--quota", "nosuch"]).await;
    assert!(!report.status.success());
    assert!(String::from_utf8_lossy(&report.stderr).contains("no quota `nosuch`"));

    // A lease is released only by the flow that holds it.
    let granted = app.reserve(json!({"flow": "invoice"})).await;
    let lease = granted.lease_id.expect("a lease on a max_in_flight quota");
    let response = app
        .post("/v1/report")
        .json(&json!({"flow": "ack", "lease_id": lease}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM quota_place WHERE lease_id = $1")
        .bind(lease)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(held, 1, "the lease stays held");
    let released = app
        .post_json("/v1/report", json!({"flow": "invoice", "lease_id": lease}))
        .await;
    assert_eq!(released["released"], true);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn objects_are_read_and_deleted_one_at_a_time(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    app.admin_json(
        Method::PUT,
        "/v1/quotas/ppf",
        Some(json!({"hourly_ceiling": 10})),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/invoice",
        Some(json!({"quota": "ppf"})),
    )
    .await;
    app.reserve(json!({"flow": "invoice"})).await;
    let quota = app.admin_json(Method::GET, "/v1/quotas/ppf", None).await;
    assert_eq!(quota["hourly_ceiling"], 10);
    let in_use = app
        .admin(Method::DELETE, "/v1/quotas/ppf")
        .send()
        .await
        .unwrap();
    assert_eq!(in_use.status(), 409);
    let problem: Value = in_use.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("invoice"),
        "{problem}"
    );
    for path in ["/v1/flows/invoice", "/v1/quotas/ppf"] {
        let deleted = app.admin(Method::DELETE, path).send().await.unwrap();
        assert_eq!(deleted.status(), 204, "{path}");
        let gone = app.admin(Method::GET, path).send().await.unwrap();
        assert_eq!(gone.status(), 404, "{path}");
    }
    let decision = app.reserve(json!({"flow": "invoice"})).await;
    assert_eq!(
        decision.outcome,
        quota_arbiter::domain::decision::Outcome::Unthrottled,
        "the replica obeys the deletion at once"
    );
}

/// A flow's items not done yet (pending, or claimed with a lease running or
/// lapsed) keep it from being deleted; done ones do not.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_flow_with_work_not_done_is_not_deleted(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let quota = Some(json!({"hourly_ceiling": 10}));
    app.admin_json(Method::PUT, "/v1/quotas/ppf", quota).await;
    let flow = Some(json!({"quota": "ppf"}));
    app.admin_json(Method::PUT, "/v1/flows/invoice", flow).await;
    sqlx::raw_sql(
        "INSERT INTO work_item (flow, priority, payload, state, lease_until, done_at) VALUES
            ('invoice', 2, '{}', 'pending', NULL, NULL),
            ('invoice', 2, '{}', 'claimed', now() + interval '1 minute', NULL),
            ('invoice', 2, '{}', 'claimed', now() - interval '1 minute', NULL),
            ('invoice', 2, '{}', 'done', NULL, now()),
            ('other', 2, '{}', 'pending', NULL, NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let in_use = app.admin(Method::DELETE, "/v1/flows/invoice").send().await;
    let in_use = in_use.unwrap();
    assert_eq!(in_use.status(), 409);
    let problem: Value = in_use.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("3 work item(s)"), "{detail}");

    sqlx::query(
        "UPDATE work_item SET state = 'done', lease_until = NULL, done_at = now()
         WHERE flow = 'invoice'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let deleted = app.admin(Method::DELETE, "/v1/flows/invoice").send().await;
    assert_eq!(deleted.unwrap().status(), 204);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_mistyped_variable_or_a_missing_config_file_is_named(pool: PgPool) {
    let env = [
        ("QUOTA_HOURLY_CEILNG", "5"),
        ("QUOTA_SERVICE_HOST", "10.0.0.1"),
        ("QUOTA_PORT_8080_TCP", "tcp://10.0.0.1:8080"),
    ];
    let output = cli_with_env(&pool, &["flows"], &env).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("QUOTA_HOURLY_CEILNG") && stderr.contains("QUOTA_HOURLY_CEILING"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("SERVICE_HOST") && !stderr.contains("PORT_8080"),
        "platform-injected variables are not warned about: {stderr}"
    );

    let missing = cli_with_env(
        &pool,
        &["flows"],
        &[("QUOTA_CONFIG", "/nonexistent/qa.toml")],
    )
    .await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(stderr.contains("/nonexistent/qa.toml"), "{stderr}");
    assert!(!stderr.contains("``"), "no empty key: {stderr}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_deadline_without_a_zone_says_what_is_expected(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let response = app
        .post_reserve(json!({"flow": "invoice", "deadline": "2026-11-30T14:30:00"}))
        .await;
    assert_eq!(response.status(), 422);
    let problem: Value = response.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("RFC 3339") && detail.contains("zone"),
        "{detail}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_flow_opts_in_to_the_local_fallback_on_every_surface(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let flow = "/v1/flows/invoice";
    let stored = || async {
        sqlx::query_scalar::<_, String>("SELECT fallback FROM flow WHERE name = 'invoice'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let created = app
        .admin_json(
            Method::PUT,
            flow,
            Some(json!({"quota": "api", "create_quota": true})),
        )
        .await;
    assert_eq!(created["fallback"], "off", "off unless asked: {created}");
    let local = app
        .admin_json(Method::PATCH, flow, Some(json!({"fallback": "local"})))
        .await;
    assert_eq!(local["fallback"], "local");
    // Other changes keep it; GET shows it.
    app.admin_json(Method::PATCH, flow, Some(json!({"mode": "enforce"})))
        .await;
    let shown = app.admin_json(Method::GET, flow, None).await;
    assert_eq!(shown["fallback"], "local", "{shown}");
    // `null` is back to off; PUT without it too.
    app.admin_json(Method::PATCH, flow, Some(json!({"fallback": null})))
        .await;
    assert_eq!(stored().await, "off");
    app.admin_json(
        Method::PUT,
        flow,
        Some(json!({"quota": "api", "fallback": "local"})),
    )
    .await;
    assert_eq!(stored().await, "local");
    app.admin_json(Method::PUT, flow, Some(json!({"quota": "api"})))
        .await;
    assert_eq!(stored().await, "off");
    // The CLI sets it the same way, and lists it.
    stdout(&cli(&pool, &["flow", "invoice", "--fallback", "local"]).await);
    assert_eq!(stored().await, "local");
    let listed = stdout(&cli(&pool, &["flows"]).await);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("invoice") && l.trim_end().ends_with("local")),
        "{listed}"
    );
    let refused = app
        .admin(Method::PATCH, flow)
        .json(&json!({"fallback": "remote"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    assert!(!cli(&pool, &["flow", "invoice", "--fallback", "remote"])
        .await
        .status
        .success());
}
