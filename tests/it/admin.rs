//! Admin API: bearer token, quotas, flows, windows.

use quota_arbiter::config::Config;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{create_flow, test_config, TestApp};

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn admin_calls_need_the_bearer_token(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let anonymous = app.get("/v1/quotas").send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let wrong = app
        .get("/v1/flows")
        .bearer_auth("test-admin-tokeN")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(wrong.headers()["content-type"], "application/problem+json");
    assert_eq!(
        app.admin(Method::GET, "/v1/quotas")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn without_a_configured_token_admin_is_refused_clearly(pool: PgPool) {
    let config = Config {
        admin_token: None,
        ..test_config()
    };
    let app = TestApp::spawn_with(pool, config).await;
    let response = app.admin(Method::GET, "/v1/flows").send().await.unwrap();
    assert_eq!(response.status(), 403);
    let problem: Value = response.json().await.unwrap();
    assert!(problem["type"].as_str().unwrap().ends_with("/forbidden"));
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("QUOTA_ADMIN_TOKEN"));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn quotas_and_flows_are_created_updated_and_listed(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let quota: Value = app
        .admin_json(
            Method::PUT,
            "/v1/quotas/ppf",
            Some(json!({"hourly_ceiling": 1000})),
        )
        .await;
    assert_eq!(quota["hourly_ceiling"], 1000);
    assert!(
        quota["rate"].is_null() && quota["effective_rate"].is_null(),
        "no cadence: {quota}"
    );
    assert!(quota["effective_burst"].is_null(), "{quota}");

    // A flow created without a mode observes.
    let flow: Value = app
        .admin_json(
            Method::PUT,
            "/v1/flows/invoice",
            Some(json!({"quota": "ppf", "priority": 1})),
        )
        .await;
    assert_eq!(
        (flow["mode"].as_str(), flow["priority"].as_i64()),
        (Some("observe"), Some(1))
    );
    let flipped: Value = app
        .admin_json(
            Method::PUT,
            "/v1/flows/invoice",
            Some(json!({"quota": "ppf", "mode": "enforce"})),
        )
        .await;
    assert_eq!(
        (flipped["mode"].as_str(), flipped["priority"].as_i64()),
        (Some("enforce"), Some(2)),
        "PUT replaces: a priority left out is the default"
    );
    // PUT replaces the whole flow: left out, the mode is observe again.
    let replaced: Value = app
        .admin_json(
            Method::PUT,
            "/v1/flows/invoice",
            Some(json!({"quota": "ppf", "priority": 1})),
        )
        .await;
    assert_eq!(replaced["mode"], "observe");
    // PATCH changes only what it names.
    app.admin_json(
        Method::PATCH,
        "/v1/flows/invoice",
        Some(json!({"mode": "enforce"})),
    )
    .await;
    let kept: Value = app
        .admin_json(
            Method::PATCH,
            "/v1/flows/invoice",
            Some(json!({"priority": 2})),
        )
        .await;
    assert_eq!(
        (kept["mode"].as_str(), kept["priority"].as_i64()),
        (Some("enforce"), Some(2))
    );

    // A flow naming an unknown quota is refused, unless creating it is asked for.
    let typo = app
        .admin(Method::PUT, "/v1/flows/ack")
        .json(&json!({"quota": "sms"}))
        .send()
        .await
        .unwrap();
    assert_eq!(typo.status(), 422);
    let problem: Value = typo.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("`sms`"),
        "{problem}"
    );
    let ack: Value = app
        .admin_json(
            Method::PUT,
            "/v1/flows/ack",
            Some(json!({"quota": "sms", "create_quota": true})),
        )
        .await;
    assert_eq!(ack["quota"], "sms");
    let quotas: Value = app.admin_json(Method::GET, "/v1/quotas", None).await;
    let names: Vec<(&str, i64)> = quotas["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["name"].as_str().unwrap(),
                q["hourly_ceiling"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, vec![("ppf", 1000), ("sms", 1000)]);
    let flows: Value = app.admin_json(Method::GET, "/v1/flows", None).await;
    assert_eq!(flows["flows"].as_array().unwrap().len(), 2);

    // The catalog is refreshed at once: the flip is obeyed by this replica.
    let decision: Value = app
        .post_reserve(json!({"flow": "invoice"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(decision["mode"], "enforce");
}

/// PATCH changes what exists; PUT creates. A typo'd or deleted name is a 404
/// and leaves no row behind (schemathesis's stateful check: a deleted
/// resource must stay gone).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn patch_of_a_missing_quota_or_flow_is_a_404(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let patch = |path: &'static str, body: Value| {
        app.admin(Method::PATCH, path)
            .header("content-type", "application/merge-patch+json")
            .body(body.to_string())
            .send()
    };
    let rows = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    for (path, body, named) in [
        ("/v1/quotas/ppff", json!({"hourly_ceiling": 10}), "`ppff`"),
        (
            "/v1/flows/invoce",
            json!({"quota": "ppf", "priority": 1}),
            "`invoce`",
        ),
    ] {
        let response = patch(path, body).await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(
            problem["type"],
            "https://quota-arbiter.dev/problems/not-found"
        );
        assert!(
            problem["detail"].as_str().unwrap().contains(named),
            "{problem}"
        );
    }
    assert_eq!(
        (rows("quota").await, rows("flow").await),
        (0, 0),
        "nothing created"
    );

    // Created by PUT, PATCH changes it; deleted, it is a 404 again.
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
    let changed: Value = app
        .admin_json(
            Method::PATCH,
            "/v1/flows/invoice",
            Some(json!({"priority": 1})),
        )
        .await;
    assert_eq!(changed["priority"], 1);
    for path in ["/v1/flows/invoice", "/v1/quotas/ppf"] {
        let gone = app.admin(Method::DELETE, path).send().await.unwrap();
        assert_eq!(gone.status(), 204, "{path}");
    }
    for (path, body) in [
        ("/v1/flows/invoice", json!({"priority": 2})),
        ("/v1/quotas/ppf", json!({"hourly_ceiling": 20})),
    ] {
        assert_eq!(patch(path, body).await.unwrap().status(), 404, "{path}");
    }
    assert_eq!(
        (rows("quota").await, rows("flow").await),
        (0, 0),
        "still gone"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn admin_input_is_validated(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let bad = [
        ("/v1/quotas/ppf", json!({"hourly_ceiling": -1})),
        (
            "/v1/quotas/ppf",
            json!({"hourly_ceiling": 10, "extra": true}),
        ),
        ("/v1/quotas/bad%20name", json!({"hourly_ceiling": 10})),
        ("/v1/quotas/ppf", json!({"hourly_ceiling": i64::MAX})),
        ("/v1/quotas/ppf", json!({"rate": 1e308, "burst": 1e308})),
        ("/v1/quotas/ppf", json!({"rate": 2})),
        ("/v1/quotas/ppf", json!({"rate": 0, "burst": 5})),
        (
            "/v1/flows/invoice",
            json!({"quota": "ppf", "mode": "sometimes"}),
        ),
        ("/v1/flows/invoice", json!({"quota": "ppf", "priority": 0})),
        ("/v1/flows/invoice", json!({"mode": "enforce"})),
    ];
    for (path, body) in bad {
        let response = app
            .admin(Method::PUT, path)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_client_error(),
            "{path} {body}: {}",
            response.status()
        );
    }
    let response = app
        .admin(Method::GET, "/v1/windows?last=0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let response = app
        .admin(Method::GET, "/v1/windows?last=abc")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn windows_report_count_ceiling_and_tallies(pool: PgPool) {
    create_flow(&pool, "ppf", 2, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for _ in 0..3 {
        app.post_reserve(json!({"flow": "invoice"})).await;
    }
    let want = json!({"count": 2, "hourly_ceiling": 2, "granted": 2, "deferred": 1});
    let got = crate::helpers::eventually(std::time::Duration::from_secs(5), want.clone(), || async {
        let windows: Value = app.admin_json(Method::GET, "/v1/windows?quota=ppf&last=24", None).await;
        let w = &windows["windows"][0];
        json!({"count": w["count"], "hourly_ceiling": w["hourly_ceiling"], "granted": w["granted"], "deferred": w["deferred"]})
    })
    .await;
    assert_eq!(got, want);
}

/// A cadence inside its bounds is taken as given, the largest of each too.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_quota_takes_a_cadence_within_its_bounds(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    for (rate, burst) in [(2.0, 20.0), (1e6, 1e9), (0.001, 1.0)] {
        let quota: Value = app
            .admin_json(
                Method::PUT,
                "/v1/quotas/ppf",
                Some(json!({"hourly_ceiling": 1000, "rate": rate, "burst": burst})),
            )
            .await;
        assert_eq!(
            (quota["rate"].as_f64(), quota["burst"].as_f64()),
            (Some(rate), Some(burst)),
            "{quota}"
        );
    }
}
