//! API keys and roles (`auth = "keys"`): the CLI, each role against each
//! class of endpoint, revocation across replicas, lease ownership, and
//! `open` mode as it was.

use std::time::{Duration, Instant};

use quota_arbiter::auth::{self, AuthMode};
use quota_arbiter::domain::decision::{Decision, Outcome};
use quota_arbiter::store::Store;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    cli, cli_with_env, create_flow, database_url, eventually, postgres_host_port, problem_slug,
    set_limits, stdout, test_config, Replica, TestApp, ADMIN_TOKEN,
};

/// A key straight in the table, as `keys create` stores it.
async fn key(pool: &PgPool, role: &str) -> String {
    let key = auth::new_key().unwrap();
    Store::new(pool.clone())
        .create_key(None, role, None, &auth::key_hash(&key))
        .await
        .unwrap();
    key
}

async fn keys_app(pool: &PgPool) -> TestApp {
    let config = quota_arbiter::config::Config {
        auth: AuthMode::Keys,
        ..test_config()
    };
    TestApp::spawn_with(pool.clone(), config).await
}

/// Calls `method path` (a JSON body on writes) with `key`, if any.
async fn call(
    client: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    (method, path, body): &(Method, &str, Option<Value>),
) -> reqwest::Response {
    let mut request = client.request(method.clone(), format!("{base}{path}"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.expect("request sent")
}

async fn problem_type(response: reqwest::Response) -> String {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    problem_slug(&problem)
}

/// `KEY=$(quota-arbiter keys create …)` captures the key alone, whatever the
/// command logs (here every statement, as sqlx logs them at debug level; under
/// load, a slow statement's warning): logs go to standard error.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_created_key_is_alone_on_standard_output_whatever_is_logged(pool: PgPool) {
    let created = cli_with_env(
        &pool,
        &["keys", "create", "--role", "worker"],
        &[("RUST_LOG", "debug")],
    )
    .await;
    let out = stdout(&created);
    let key = out.strip_suffix('\n').unwrap_or(&out);
    assert!(
        key.starts_with("qa_") && key.len() == 3 + 64 && !key.contains('\n'),
        "stdout: {out:?}"
    );
    let logged = String::from_utf8_lossy(&created.stderr);
    assert!(logged.lines().count() > 1, "the logs: {logged}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn keys_are_created_once_listed_without_secrets_and_revoked(pool: PgPool) {
    let created = cli(
        &pool,
        &[
            "keys", "create", "--role", "worker", "--tenant", "acme", "--name", "ci",
        ],
    )
    .await;
    let key = stdout(&created).trim().to_string();
    assert!(key.starts_with("qa_") && key.len() >= 3 + 32, "{key}");
    let stored: Vec<u8> = sqlx::query_scalar("SELECT hash FROM api_key")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, auth::key_hash(&key), "only the hash is stored");

    let listed = stdout(&cli(&pool, &["keys", "list"]).await);
    assert!(!listed.contains(&key[3..]), "never a secret: {listed}");
    let row = listed.lines().nth(1).expect("one key listed");
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&fields[..4], ["1", "worker", "acme", "ci"], "{row}");
    assert_eq!(fields.last(), Some(&"-"), "not revoked: {row}");

    stdout(&cli(&pool, &["keys", "revoke", "1"]).await);
    let listed = stdout(&cli(&pool, &["keys", "list"]).await);
    assert_ne!(
        listed.lines().nth(1).unwrap().split_whitespace().last(),
        Some("-")
    );
    assert!(!cli(&pool, &["keys", "revoke", "2"]).await.status.success());
    let bad_role = cli(&pool, &["keys", "create", "--role", "root"]).await;
    assert!(!bad_role.status.success());
}

/// The role each route's group declares, as a caller meets it in `keys`
/// mode: below it a key is refused (403; no key at all: 401), at it the call
/// gets past the check (whatever the handler then answers). Paths no route
/// has, and methods a path does not have, are for admins.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_route_needs_the_role_of_its_group(pool: PgPool) {
    let (operator, worker, admin) = (
        key(&pool, "operator").await,
        key(&pool, "worker").await,
        key(&pool, "admin").await,
    );
    let app = keys_app(&pool).await;
    let send = |method: Method, path: &str, key: Option<&str>| {
        let mut request = app.request(method, path);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.unwrap().status() }
    };
    let open = [
        (Method::GET, "/healthz"),
        (Method::GET, "/readyz"),
        (Method::GET, "/openapi.json"),
    ];
    for (method, path) in open {
        let status = send(method.clone(), path, None).await;
        assert!(status.is_success(), "{method} {path}: {status}");
    }
    let operators = [
        (Method::GET, "/"),
        (Method::GET, "/metrics"),
        (Method::GET, "/v1/windows"),
        (Method::GET, "/v1/report"),
    ];
    let workers = [
        (Method::POST, "/v1/reserve"),
        (Method::POST, "/v1/reserve/batch"),
        (Method::POST, "/v1/report"),
        (Method::POST, "/v1/work"),
        (Method::POST, "/v1/work/claim"),
        (Method::POST, "/v1/work/17/done"),
        (Method::POST, "/v1/work/17/release"),
        // The done route, with an id that is not one (a 400 past the check).
        (Method::POST, "/v1/work//done"),
        (Method::GET, "/v1/work/17"),
        (Method::GET, "/v1/admit"),
        (Method::POST, "/v1/admit"),
        (Method::GET, "/v1/stream?flow=invoice"),
    ];
    let admins = [
        (Method::GET, "/v1/quotas"),
        (Method::GET, "/v1/route-classes"),
        (Method::PUT, "/v1/route-classes/public-apis"),
        (Method::DELETE, "/v1/route-classes/public-apis"),
        (Method::PUT, "/v1/admit"),
        (Method::PUT, "/v1/quotas/ppf"),
        (Method::PATCH, "/v1/flows/invoice"),
        (Method::DELETE, "/v1/flows/invoice"),
        (Method::DELETE, "/v1/work/17"),
        (Method::POST, "/v1/work/17/other"),
        (Method::GET, "/v1/work/17/done/x"),
        (Method::GET, "/v1/work/17/done"),
        (Method::DELETE, "/v1/work/17/release"),
        (Method::GET, "/v1/reserve"),
        (Method::GET, "/v1/unknown"),
        (Method::GET, "/healthz/"),
        (Method::POST, "/healthz"),
        (Method::POST, "/openapi.json"),
    ];
    let needs = [
        (&operators[..], None, operator.as_str()),
        (&workers[..], Some(operator.as_str()), worker.as_str()),
        (&admins[..], Some(worker.as_str()), admin.as_str()),
    ];
    for (routes, below, enough) in needs {
        for (method, path) in routes {
            let what = format!("{method} {path}");
            assert_eq!(
                send(method.clone(), path, None).await,
                StatusCode::UNAUTHORIZED,
                "{what}"
            );
            if let Some(below) = below {
                let status = send(method.clone(), path, Some(below)).await;
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{what} with a key of the role below"
                );
            }
            let status = send(method.clone(), path, Some(enough)).await;
            assert!(
                ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status),
                "{what} with a key of its role: {status}"
            );
        }
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn each_role_reaches_its_class_of_endpoint_and_no_further(pool: PgPool) {
    create_flow(&pool, "ppf", 1000, "invoice", "enforce").await;
    let (operator, worker, admin) = (
        key(&pool, "operator").await,
        key(&pool, "worker").await,
        key(&pool, "admin").await,
    );
    let app = keys_app(&pool).await;
    let open = (Method::GET, "/healthz", None);
    let views = [
        (Method::GET, "/", None),
        (Method::GET, "/metrics", None),
        (Method::GET, "/v1/windows", None),
        (Method::GET, "/v1/report", None),
    ];
    let work = [
        (
            Method::POST,
            "/v1/reserve",
            Some(json!({"flow": "invoice"})),
        ),
        (
            Method::POST,
            "/v1/reserve/batch",
            Some(json!({"items": [{"flow": "invoice"}]})),
        ),
        (
            Method::POST,
            "/v1/report",
            Some(json!({"flow": "invoice", "status": 429})),
        ),
        // The worker client follows its share with its own key.
        (Method::GET, "/v1/stream?flow=invoice", None),
    ];
    let writes = [
        (Method::GET, "/v1/quotas", None),
        (
            Method::PUT,
            "/v1/quotas/other",
            Some(json!({"hourly_ceiling": 5})),
        ),
    ];
    let classes: [(&str, Vec<_>); 3] = [
        ("views", views.to_vec()),
        ("work", work.to_vec()),
        ("admin", writes.to_vec()),
    ];
    // Which classes each caller reaches; the others answer 403 (401 without a key).
    let callers = [
        (None, vec![]),
        (Some(operator.as_str()), vec!["views"]),
        (Some(worker.as_str()), vec!["views", "work"]),
        (Some(admin.as_str()), vec!["views", "work", "admin"]),
        (Some(ADMIN_TOKEN), vec!["views", "work", "admin"]),
        (Some("qa_0000"), vec![]),
    ];
    for (caller, reaches) in &callers {
        let response = call(&app.client, &app.base, *caller, &open).await;
        assert_eq!(response.status(), StatusCode::OK, "{caller:?} on /healthz");
        for (class, routes) in &classes {
            for route in routes {
                let response = call(&app.client, &app.base, *caller, route).await;
                let status = response.status();
                let what = format!("{caller:?} on {} {}", route.0, route.1);
                if reaches.contains(class) {
                    assert!(status.is_success(), "{what}: {status}");
                } else if caller.is_none() || *caller == Some("qa_0000") {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
                    assert_eq!(problem_type(response).await, "unauthorized", "{what}");
                } else {
                    assert_eq!(status, StatusCode::FORBIDDEN, "{what}");
                    let problem: Value = response.json().await.unwrap();
                    assert_eq!(problem_slug(&problem), "forbidden", "{what}");
                    // The problem names the role the route needs.
                    let needed = match *class {
                        "views" => "operator",
                        "work" => "worker",
                        _ => "admin",
                    };
                    let detail = problem["detail"].as_str().unwrap_or_default();
                    assert!(
                        detail.contains(&format!("needs the {needed} role")),
                        "{what}: {detail}"
                    );
                }
            }
        }
    }
    let spec = call(
        &app.client,
        &app.base,
        None,
        &(Method::GET, "/openapi.json", None),
    )
    .await;
    assert_eq!(spec.status(), StatusCode::OK);
}

async fn reserve_with(app: &TestApp, key: &str) -> Decision {
    let response = call(
        &app.client,
        &app.base,
        Some(key),
        &(
            Method::POST,
            "/v1/reserve",
            Some(json!({"flow": "invoice"})),
        ),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

async fn release_with(app: &TestApp, key: &str, lease_id: i64) -> reqwest::Response {
    let body = json!({"flow": "invoice", "lease_id": lease_id});
    call(
        &app.client,
        &app.base,
        Some(key),
        &(Method::POST, "/v1/report", Some(body)),
    )
    .await
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn only_the_key_that_took_a_lease_or_an_admin_frees_it(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 1").await;
    let (alice, mallory, admin) = (
        key(&pool, "worker").await,
        key(&pool, "worker").await,
        key(&pool, "admin").await,
    );
    let app = keys_app(&pool).await;

    let held = reserve_with(&app, &alice).await;
    let lease_id = held.lease_id.expect("a grant holds a lease");
    let stolen = release_with(&app, &mallory, lease_id).await;
    assert_eq!(stolen.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_type(stolen).await, "forbidden");
    let still_full = reserve_with(&app, &mallory).await;
    assert_eq!(
        still_full.outcome,
        Outcome::Deferred,
        "the lease stays held"
    );

    let freed = release_with(&app, &alice, lease_id).await;
    assert_eq!(freed.status(), StatusCode::OK);
    let freed: Value = freed.json().await.unwrap();
    assert_eq!(freed["released"], true);

    let taken = reserve_with(&app, &mallory).await;
    let lease_id = taken.lease_id.expect("the place is free again");
    let stolen = release_with(&app, &alice, lease_id).await;
    assert_eq!(
        stolen.status(),
        StatusCode::FORBIDDEN,
        "alice took the first lease, not this one"
    );
    let by_admin = release_with(&app, &admin, lease_id).await;
    assert_eq!(by_admin.status(), StatusCode::OK);
    let by_admin: Value = by_admin.json().await.unwrap();
    assert_eq!(by_admin["released"], true, "an admin frees any lease");
}

/// Who took a lease is kept past the lease (60 s at most) only until the
/// pruning task's retention, a batch at a time, the newer records kept.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn lease_holders_past_their_retention_are_pruned_a_batch_at_a_time(pool: PgPool) {
    let store = Store::new(pool.clone());
    let hash = auth::key_hash("any");
    let (key_id, _) = store.create_key(None, "worker", None, &hash).await.unwrap();
    store.hold_leases(&[11, 12, 13], key_id).await.unwrap();
    sqlx::query(
        "UPDATE lease_holder SET taken_at = arbiter_now() - interval '10 minutes'
         WHERE lease_id IN (11, 12)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let retention = Duration::from_secs(120);
    let mut batches = Vec::new();
    for _ in 0..3 {
        batches.push(store.prune_lease_holders(retention, 1).await.unwrap());
    }
    assert_eq!(batches, [1, 1, 0], "one record a batch, then none left");
    assert_eq!(store.lease_holder(11).await.unwrap(), None);
    assert_eq!(store.lease_holder(13).await.unwrap(), Some(key_id));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_revoked_key_is_refused_on_another_replica_within_a_second(pool: PgPool) {
    let url = database_url(&pool, &postgres_host_port()).await;
    let keys_mode = [("QUOTA_AUTH", "keys")];
    let (first, second) = (
        Replica::spawn_with(&url, &keys_mode).await,
        Replica::spawn_with(&url, &keys_mode).await,
    );
    let client = reqwest::Client::new();
    let metrics = (Method::GET, "/metrics", None);
    let status = |replica: &Replica, key: String| {
        let (client, base, route) = (client.clone(), replica.base.clone(), metrics.clone());
        async move { call(&client, &base, Some(&key), &route).await.status() }
    };

    let created = Instant::now();
    let key = stdout(&cli(&pool, &["keys", "create", "--role", "operator"]).await)
        .trim()
        .to_string();
    for replica in [&first, &second] {
        let seen = eventually(Duration::from_secs(1), StatusCode::OK, || {
            status(replica, key.clone())
        })
        .await;
        assert_eq!(seen, StatusCode::OK, "a new key is accepted everywhere");
    }
    assert!(created.elapsed() < Duration::from_secs(3));

    stdout(&cli(&pool, &["keys", "revoke", "1"]).await);
    let revoked = Instant::now();
    for replica in [&first, &second] {
        let refused = eventually(Duration::from_secs(3), StatusCode::UNAUTHORIZED, || {
            status(replica, key.clone())
        })
        .await;
        assert_eq!(refused, StatusCode::UNAUTHORIZED);
        assert!(
            revoked.elapsed() <= Duration::from_secs(1),
            "refused after {:?}, not within a second",
            revoked.elapsed()
        );
    }
    // Once refused, refused for good: a replica's periodic reload (every 2 s)
    // that read the keys before the revocation must not bring the key back.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(2500) {
        for replica in [&first, &second] {
            assert_eq!(status(replica, key.clone()).await, StatusCode::UNAUTHORIZED);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn open_mode_trusts_every_caller_as_before(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 1").await;
    let worker = key(&pool, "worker").await;
    let app = TestApp::spawn(pool.clone()).await;
    for route in [
        (Method::GET, "/", None),
        (Method::GET, "/metrics", None),
        (
            Method::POST,
            "/v1/report",
            Some(json!({"flow": "invoice", "status": 200})),
        ),
    ] {
        let response = call(&app.client, &app.base, None, &route).await;
        assert_eq!(response.status(), StatusCode::OK, "{} {}", route.0, route.1);
    }
    // Keys are no admin token in `open` mode: the admin API is as it was.
    let quotas = (Method::GET, "/v1/quotas", None);
    let with_key = call(&app.client, &app.base, Some(&worker), &quotas).await;
    assert_eq!(with_key.status(), StatusCode::UNAUTHORIZED);
    let with_token = call(&app.client, &app.base, Some(ADMIN_TOKEN), &quotas).await;
    assert_eq!(with_token.status(), StatusCode::OK);
    // There are no keys to own leases: whoever shows a lease id frees it.
    let held = app.reserve(json!({"flow": "invoice"})).await;
    let freed = app
        .post_json(
            "/v1/report",
            json!({"flow": "invoice", "lease_id": held.lease_id.unwrap()}),
        )
        .await;
    assert_eq!(freed["released"], true);
}
