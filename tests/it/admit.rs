//! Caller-scoped admission (`/v1/admit`, design.md §11): tenant shares of a
//! shared route class, each caller's burst and sustained rate, the anonymous
//! class by network range, fail closed when the store is cut, the RateLimit
//! fields and Retry-After in agreement, no neighbour leakage, and roles.

use std::time::{Duration, Instant};

use quota_arbiter::auth::{self, AuthMode};
use quota_arbiter::config::Config;
use quota_arbiter::domain::admission::RouteClassSettings;
use quota_arbiter::store::Store;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    behind_a_proxy, database_url, metrics_text, pin_clock, pin_clock_at, postgres_host_port,
    problem_slug, test_config, Replica, TestApp, ADMIN_TOKEN,
};

/// A route class straight through the admin API.
async fn route_class(app: &TestApp, name: &str, profile: Value) {
    let response = app
        .admin(Method::PUT, &format!("/v1/route-classes/{name}"))
        .json(&profile)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "PUT route class {name}");
}

/// `PATCH /v1/route-classes/{name}` with a JSON merge patch.
async fn patch_route_class(app: &TestApp, name: &str, patch: &'static str) -> reqwest::Response {
    app.admin(Method::PATCH, &format!("/v1/route-classes/{name}"))
        .header("content-type", "application/merge-patch+json")
        .body(patch)
        .send()
        .await
        .unwrap()
}

/// `GET /v1/admit` for a principal of a tenant (`None`: anonymous).
async fn admit(app: &TestApp, who: Option<(&str, &str)>, class: &str) -> reqwest::Response {
    let mut request = app.get("/v1/admit").header("X-Quota-Route-Class", class);
    if let Some((principal, tenant)) = who {
        request = request
            .header("X-Quota-Principal", principal)
            .header("X-Quota-Tenant", tenant);
    }
    request.send().await.unwrap()
}

/// An anonymous caller behind a proxy that forwards `address`.
async fn admit_from(app: &TestApp, address: &str, class: &str) -> reqwest::Response {
    app.get("/v1/admit")
        .header("X-Quota-Route-Class", class)
        .header("X-Forwarded-For", format!("192.0.2.250, {address}"))
        .send()
        .await
        .unwrap()
}

/// Everything a caller sees of an answer: status, every header, the body.
struct Seen {
    status: StatusCode,
    headers: String,
    body: String,
    retry_after: Option<u64>,
    ratelimit: Option<String>,
    policy: Option<String>,
}

async fn seen(response: reqwest::Response) -> Seen {
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let retry_after = header("retry-after").map(|v| v.parse().unwrap());
    let (ratelimit, policy) = (header("ratelimit"), header("ratelimit-policy"));
    let headers = format!("{:?}", response.headers());
    let body = response.text().await.unwrap();
    Seen {
        status,
        headers,
        body,
        retry_after,
        ratelimit,
        policy,
    }
}

impl Seen {
    fn problem_type(&self) -> String {
        problem_slug(&serde_json::from_str(&self.body).unwrap())
    }

    /// `r` and `t` of the RateLimit field.
    fn remaining_and_reset(&self) -> (u64, Option<u64>) {
        let field = self.ratelimit.as_deref().expect("a RateLimit field");
        let param = |key: &str| {
            field
                .split(';')
                .find_map(|p| p.strip_prefix(&format!("{key}=")))
                .map(|v| v.parse::<u64>().unwrap())
        };
        (param("r").expect("r"), param("t"))
    }

    fn mentions(&self, text: &str) -> bool {
        self.headers.contains(text) || self.body.contains(text)
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn one_tenant_hammering_takes_no_more_than_its_share_and_the_other_is_admitted(pool: PgPool) {
    // Ten minutes into the hour: the hour-long window does not turn over.
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    // Callers' buckets never limit here: only the shares and the capacity.
    let profile = json!({"burst": 1000, "rate": 100, "capacity": 10,
                         "window_seconds": 3600, "tenant_share": 0.5});
    route_class(&app, "partner-apis", profile).await;

    let mut acme_admitted = 0;
    for i in 0..30 {
        let principal = format!("acme-user-{}", i % 4);
        let answer = seen(admit(&app, Some((&principal, "acme")), "partner-apis").await).await;
        match answer.status {
            StatusCode::NO_CONTENT => acme_admitted += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(answer.problem_type(), "capacity-exhausted");
                assert!(answer.retry_after.is_some(), "until the window ends");
            }
            other => panic!("acme got {other}: {}", answer.body),
        }
    }
    assert_eq!(acme_admitted, 5, "half of a capacity of 10");

    // The other tenant still gets its share, and none of its answers names acme.
    let mut globex_admitted = 0;
    for i in 0..8 {
        let principal = format!("globex-user-{}", i % 2);
        let answer = seen(admit(&app, Some((&principal, "globex")), "partner-apis").await).await;
        assert!(
            !answer.mentions("acme"),
            "globex sees nothing of acme: {} {}",
            answer.headers,
            answer.body
        );
        if answer.status == StatusCode::NO_CONTENT {
            globex_admitted += 1;
        } else {
            assert_eq!(answer.problem_type(), "capacity-exhausted");
        }
    }
    assert_eq!(globex_admitted, 5);
    let counted: i64 =
        sqlx::query_scalar("SELECT admitted FROM admit_window WHERE route_class = 'partner-apis'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(counted, 10);

    let metrics = metrics_text(&app.client, &app.base).await;
    for (outcome, count) in [("admitted", 10), ("capacity_exhausted", 28)] {
        let series = format!(
            r#"quota_admit_total{{route_class="partner-apis",outcome="{outcome}"}} {count}"#
        );
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
    assert!(!metrics.contains("acme") && !metrics.contains("globex-user"));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_refusal_never_carries_another_callers_or_tenants_identifiers(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool).await;
    let profile = json!({"burst": 2, "rate": 0.001, "capacity": 1000,
                         "window_seconds": 60, "tenant_share": 1});
    route_class(&app, "public-apis", profile).await;

    // alice of acme spends her bucket; bob of globex spends his.
    for who in [("alice", "acme"), ("bob", "globex")] {
        for _ in 0..2 {
            let answer = seen(admit(&app, Some(who), "public-apis").await).await;
            assert_eq!(answer.status, StatusCode::NO_CONTENT);
        }
    }
    for (who, others) in [
        (("alice", "acme"), ["bob", "globex"]),
        (("bob", "globex"), ["alice", "acme"]),
    ] {
        let answer = seen(admit(&app, Some(who), "public-apis").await).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.problem_type(), "caller-rate-limited");
        for other in others {
            assert!(
                !answer.mentions(other),
                "{who:?} sees `{other}`: {} {}",
                answer.headers,
                answer.body
            );
        }
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_principal_gets_its_burst_at_once_then_the_sustained_rate(pool: PgPool) {
    let first = pin_clock_at(&pool, 600.0).await;
    let app = TestApp::spawn(first).await;
    // One token every 10 s: a slow machine cannot blur the count.
    let profile = json!({"burst": 3, "rate": 0.1, "capacity": 1000,
                         "window_seconds": 60, "tenant_share": 1});
    route_class(&app, "public-apis", profile).await;

    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            admit(&app, Some(("alice", "acme")), "public-apis")
                .await
                .status(),
        );
    }
    let admitted = statuses
        .iter()
        .filter(|s| **s == StatusCode::NO_CONTENT)
        .count();
    assert_eq!(admitted, 3, "the burst at once: {statuses:?}");
    let refused = seen(admit(&app, Some(("alice", "acme")), "public-apis").await).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry = refused.retry_after.expect("Retry-After on a 429");
    assert!((9..=10).contains(&retry), "the next token in 10 s: {retry}");
    // Another principal of the same tenant has a bucket of its own.
    let carol = admit(&app, Some(("carol", "acme")), "public-apis").await;
    assert_eq!(carol.status(), StatusCode::NO_CONTENT);

    // 25 s later (database clock): two and a half tokens, so two admissions.
    let later = pin_clock_at(&pool, 625.0).await;
    let app = TestApp::spawn(later).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            admit(&app, Some(("alice", "acme")), "public-apis")
                .await
                .status(),
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::NO_CONTENT,
            StatusCode::NO_CONTENT,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn ratelimit_fields_describe_the_callers_own_bucket_and_agree_with_retry_after(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool).await;
    let profile = json!({"burst": 2, "rate": 0.5, "capacity": 1000,
                         "window_seconds": 60, "tenant_share": 1});
    route_class(&app, "public-apis", profile).await;

    let first = seen(admit(&app, Some(("alice", "acme")), "public-apis").await).await;
    assert_eq!(first.status, StatusCode::NO_CONTENT);
    assert_eq!(first.policy.as_deref(), Some("\"public-apis\";q=2;w=4"));
    assert_eq!(first.retry_after, None);
    let (remaining, reset) = first.remaining_and_reset();
    assert_eq!(remaining, 1);
    assert!(reset.is_some_and(|t| (1..=2).contains(&t)), "{reset:?}");

    let second = seen(admit(&app, Some(("alice", "acme")), "public-apis").await).await;
    assert_eq!(second.remaining_and_reset().0, 0);
    let refused = seen(admit(&app, Some(("alice", "acme")), "public-apis").await).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let (remaining, reset) = refused.remaining_and_reset();
    assert_eq!(remaining, 0);
    assert_eq!(refused.retry_after, reset, "Retry-After is the field's t");
    assert!(refused.retry_after.is_some_and(|s| (1..=2).contains(&s)));

    // Someone else's bucket is full: the fields are per caller.
    let bob = seen(admit(&app, Some(("bob", "acme")), "public-apis").await).await;
    assert_eq!(bob.remaining_and_reset().0, 1);

    // POST answers carry the same fields.
    let posted = app
        .post("/v1/admit")
        .json(&json!({"principal": "dave", "tenant": "acme", "route_class": "public-apis"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::OK);
    assert!(posted.headers().contains_key("ratelimit-policy"));
    assert_eq!(posted.headers()["ratelimit"], "\"public-apis\";r=1;t=2");
    let body: Value = posted.json().await.unwrap();
    assert_eq!(body, json!({"admitted": true}));
}

/// A 429 whose wait cannot be told (the next token more than a year away: a
/// route class written before rates had a floor) carries no `Retry-After`,
/// and no `t` in its RateLimit field, rather than a number of its own making
/// or the one its neighbour in the same group of admissions was given.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_429_without_a_wait_to_tell_carries_no_retry_after(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    for class in ["glacial", "public-apis"] {
        let profile = json!({"burst": 1, "rate": 0.1, "capacity": 1000,
                             "window_seconds": 60, "tenant_share": 1});
        route_class(&app, class, profile).await;
    }
    // A token every 100 years, as a row from before the rate's floor.
    sqlx::raw_sql(
        "ALTER TABLE route_class DROP CONSTRAINT route_class_rate_min;
         UPDATE route_class SET rate = 3e-10 WHERE name = 'glacial';",
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    for class in ["glacial", "public-apis"] {
        let first = admit(&app, Some(("alice", "acme")), class).await;
        assert_eq!(first.status(), StatusCode::NO_CONTENT, "{class}: the burst");
    }
    // Both refusals at once, so they are decided in one group.
    let (glacial, neighbour) = tokio::join!(
        admit(&app, Some(("alice", "acme")), "glacial"),
        admit(&app, Some(("alice", "acme")), "public-apis"),
    );
    let (glacial, neighbour) = (seen(glacial).await, seen(neighbour).await);
    assert_eq!(neighbour.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(neighbour.retry_after.is_some(), "{}", neighbour.headers);
    assert_eq!(glacial.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(glacial.problem_type(), "caller-rate-limited");
    assert_eq!(glacial.retry_after, None, "{}", glacial.headers);
    assert_eq!(
        glacial.remaining_and_reset(),
        (0, None),
        "{}",
        glacial.headers
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn all_or_nothing_a_share_refusal_spends_no_token_a_bucket_refusal_no_slot(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    // A tenant may take one admission of three in the window.
    let profile = json!({"burst": 1, "rate": 0.001, "capacity": 3,
                         "window_seconds": 3600, "tenant_share": 0.34});
    route_class(&app, "partner-apis", profile).await;
    let tokens = |who: (&'static str, &'static str)| {
        let pool = pool.clone();
        async move {
            let key = quota_arbiter::domain::admission::Caller::Principal {
                principal: who.0.into(),
                tenant: who.1.into(),
            }
            .bucket_key("partner-apis");
            // A caller never spent from has no row yet: its bucket is full (1).
            sqlx::query_scalar::<_, f64>(
                "SELECT coalesce((SELECT tokens FROM admit_bucket WHERE key = $1), 1)",
            )
            .bind(&key[..])
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let counts = || {
        let pool = pool.clone();
        async move {
            let class: i64 = sqlx::query_scalar("SELECT admitted FROM admit_window")
                .fetch_one(&pool)
                .await
                .unwrap();
            let tenant: i64 = sqlx::query_scalar(
                "SELECT admitted FROM admit_tenant_window WHERE tenant = 'acme'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (class, tenant)
        }
    };

    let alice = admit(&app, Some(("alice", "acme")), "partner-apis").await;
    assert_eq!(alice.status(), StatusCode::NO_CONTENT);
    // carol has a token, but acme has taken its share: her token stays.
    let carol = seen(admit(&app, Some(("carol", "acme")), "partner-apis").await).await;
    assert_eq!(carol.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(carol.problem_type(), "capacity-exhausted");
    assert!((tokens(("carol", "acme")).await - 1.0).abs() < 0.01);
    assert_eq!(carol.remaining_and_reset().0, 1, "her own bucket, unspent");
    // alice's bucket is empty: no slot of the tenant or the class is spent.
    let again = seen(admit(&app, Some(("alice", "acme")), "partner-apis").await).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(counts().await, (1, 1));
    // The other tenant's admission is counted once, in its own row.
    let bob = admit(&app, Some(("bob", "globex")), "partner-apis").await;
    assert_eq!(bob.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts().await, (2, 1));
}

fn behind_a_proxy_config() -> Config {
    Config {
        admit_client_ip_header: Some("X-Forwarded-For".into()),
        ..test_config()
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn anonymous_callers_share_a_bucket_per_network_range(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn_with(pool.clone(), behind_a_proxy_config()).await;
    let profile = json!({"burst": 2, "rate": 0.001, "capacity": 1000,
                         "window_seconds": 60, "tenant_share": 1});
    route_class(&app, "public-apis", profile).await;

    // Two addresses of one /24 share its bucket of 2.
    assert_eq!(
        admit_from(&app, "203.0.113.7", "public-apis")
            .await
            .status(),
        204
    );
    assert_eq!(
        admit_from(&app, "203.0.113.99", "public-apis")
            .await
            .status(),
        204
    );
    let third = seen(admit_from(&app, "203.0.113.200", "public-apis").await).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!third.mentions("203.0.113"), "no address is echoed");
    // Another /24 has its own; so has a /64 (two addresses of it share one).
    assert_eq!(
        admit_from(&app, "203.0.114.7", "public-apis")
            .await
            .status(),
        204
    );
    assert_eq!(
        admit_from(&app, "2001:db8:0:1::1", "public-apis")
            .await
            .status(),
        204
    );
    assert_eq!(
        admit_from(&app, "2001:db8:0:1::2", "public-apis")
            .await
            .status(),
        204
    );
    assert_eq!(
        admit_from(&app, "2001:db8:0:1:ffff::3", "public-apis")
            .await
            .status(),
        429
    );
    assert_eq!(
        admit_from(&app, "2001:db8:0:2::1", "public-apis")
            .await
            .status(),
        204
    );
    // The leftmost entries are the caller's own writing: only the last counts.
    let spoofed = app
        .get("/v1/admit")
        .header("X-Quota-Route-Class", "public-apis")
        .header("X-Forwarded-For", "198.51.100.1, 203.0.113.8")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), StatusCode::TOO_MANY_REQUESTS);

    // The anonymous callers count as one group, under no tenant's name.
    let groups: Vec<String> = sqlx::query_scalar("SELECT tenant FROM admit_tenant_window")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(groups, [""]);

    // The trusted header is missing: refused, not lumped into the proxy's range.
    let missing = seen(admit(&app, None, "public-apis").await).await;
    assert_eq!(missing.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Without a trusted header, the peer's address (127.0.0.1 here) decides.
    let direct = TestApp::spawn(pool).await;
    assert_eq!(admit(&direct, None, "public-apis").await.status(), 204);
    assert_eq!(admit(&direct, None, "public-apis").await.status(), 204);
    assert_eq!(admit(&direct, None, "public-apis").await.status(), 429);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_store_cut_is_503_store_unavailable_within_2_s_never_429(pool: PgPool) {
    let (proxy, app) = behind_a_proxy(&pool).await;
    let profile = json!({"burst": 1, "rate": 0.001, "capacity": 1000,
                         "window_seconds": 60, "tenant_share": 1});
    route_class(&app, "public-apis", profile).await;
    // alice's bucket is empty: without the store she would be a 429.
    assert_eq!(
        admit(&app, Some(("alice", "acme")), "public-apis")
            .await
            .status(),
        204
    );
    assert_eq!(
        admit(&app, Some(("alice", "acme")), "public-apis")
            .await
            .status(),
        429
    );

    proxy.cut();
    for who in [("alice", "acme"), ("bob", "globex")] {
        let started = Instant::now();
        let answer = seen(admit(&app, Some(who), "public-apis").await).await;
        let elapsed = started.elapsed();
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            answer.body
        );
        assert_eq!(answer.problem_type(), "store-unavailable");
        assert!(elapsed < Duration::from_secs(2), "503 took {elapsed:?}");
        assert_eq!(answer.retry_after, Some(2));
        assert!(answer.policy.is_some(), "the class's policy is still known");
        assert_eq!(answer.ratelimit, None, "no bucket was read");
    }
    proxy.restore();
    let back =
        crate::helpers::eventually(Duration::from_secs(10), StatusCode::NO_CONTENT, || async {
            admit(&app, Some(("carol", "acme")), "public-apis")
                .await
                .status()
        })
        .await;
    assert_eq!(back, StatusCode::NO_CONTENT);
    let metrics = metrics_text(&app.client, &app.base).await;
    let series = r#"quota_admit_total{route_class="public-apis",outcome="store_unavailable"} 2"#;
    assert!(metrics.contains(series), "{series} in\n{metrics}");
}

/// A route class the config file declares is in the table once a replica
/// has started, and a change made at run time wins over the file when a
/// replica starts again: the seed inserts a class the table lacks, nothing
/// else, and says whether it did.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_route_class_of_the_config_file_is_seeded_once_and_run_time_changes_win(pool: PgPool) {
    let declared = RouteClassSettings {
        burst: 20.0,
        rate: 5.0,
        capacity: 600,
        window_seconds: 60,
        tenant_share: 0.5,
        capacity_error_budget: 0.01,
    };
    let mut config = test_config();
    config.route_classes = [("partners".to_string(), declared.clone())].into();
    let path = "/v1/route-classes/partners";
    let app = TestApp::spawn_with(pool.clone(), config.clone()).await;
    let seeded = app.admin_json(Method::GET, path, None).await;
    assert_eq!(seeded["capacity"], 600, "{seeded}");
    let admitted = admit(&app, Some(("p-1", "t-1")), "partners").await;
    assert_eq!(
        admitted.status(),
        StatusCode::NO_CONTENT,
        "the seeded class admits"
    );
    let patched = patch_route_class(&app, "partners", r#"{"capacity": 900}"#).await;
    assert_eq!(patched.status(), StatusCode::OK);
    drop(app);

    let restarted = TestApp::spawn_with(pool.clone(), config).await;
    let kept = restarted.admin_json(Method::GET, path, None).await;
    assert_eq!(
        kept["capacity"], 900,
        "the table wins over the file: {kept}"
    );
    let store = Store::new(pool);
    assert!(!store.seed_route_class("partners", &declared).await.unwrap());
    assert!(store.seed_route_class("others", &declared).await.unwrap());
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn route_classes_are_managed_like_quotas_and_admit_checks_its_input(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let profile = json!({"burst": 20, "rate": 5, "capacity": 600,
                         "window_seconds": 60, "tenant_share": 0.5});
    route_class(&app, "public-apis", profile.clone()).await;
    let got = app
        .admin_json(Method::GET, "/v1/route-classes/public-apis", None)
        .await;
    for field in [
        "burst",
        "rate",
        "capacity",
        "window_seconds",
        "tenant_share",
    ] {
        assert_eq!(got[field].as_f64(), profile[field].as_f64(), "{field}");
    }
    let listed = app.admin_json(Method::GET, "/v1/route-classes", None).await;
    assert_eq!(listed["route_classes"].as_array().unwrap().len(), 1);
    // PATCH changes what it names; a null or a missing class is refused.
    let patched = patch_route_class(&app, "public-apis", r#"{"capacity": 900}"#).await;
    assert_eq!(patched.status(), StatusCode::OK);
    let patched: Value = patched.json().await.unwrap();
    assert_eq!(
        (patched["capacity"].as_i64(), patched["burst"].as_f64()),
        (Some(900), Some(20.0))
    );
    for (path, body, status) in [
        (
            "public-apis",
            r#"{"rate": null}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        ("nope", r#"{"rate": 2}"#, StatusCode::NOT_FOUND),
    ] {
        let response = patch_route_class(&app, path, body).await;
        assert_eq!(response.status(), status, "{path} {body}");
    }
    for bad in [
        json!({"burst": 20, "rate": 5, "capacity": 600, "window_seconds": 7, "tenant_share": 0.5}),
        json!({"burst": 20, "rate": 5, "capacity": 600, "window_seconds": 60, "tenant_share": 0}),
        json!({"burst": 20, "rate": 5, "capacity": 600, "window_seconds": 60}),
    ] {
        let response = app
            .admin(Method::PUT, "/v1/route-classes/public-apis")
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }

    // Unknown class: 404; a bad header: 422; a principal without tenant: 422.
    assert_eq!(
        admit(&app, Some(("alice", "acme")), "nope").await.status(),
        404
    );
    assert_eq!(
        admit(&app, Some(("alice", "acme")), "no pe").await.status(),
        422
    );
    let half = app
        .get("/v1/admit")
        .header("X-Quota-Route-Class", "public-apis")
        .header("X-Quota-Principal", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(half.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let twice = app
        .get("/v1/admit")
        .header("X-Quota-Route-Class", "public-apis")
        .header("X-Quota-Principal", "alice")
        .header("X-Quota-Principal", "admin")
        .header("X-Quota-Tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let no_class = app.get("/v1/admit").send().await.unwrap();
    assert_eq!(no_class.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let deleted = app
        .admin(Method::DELETE, "/v1/route-classes/public-apis")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        admit(&app, Some(("alice", "acme")), "public-apis")
            .await
            .status(),
        404
    );
    let again = app
        .admin(Method::DELETE, "/v1/route-classes/public-apis")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn in_keys_mode_a_gateway_admits_with_a_worker_key_and_admins_manage_classes(pool: PgPool) {
    let key = |role: &'static str| {
        let pool = pool.clone();
        async move {
            let key = auth::new_key().unwrap();
            Store::new(pool)
                .create_key(None, role, None, &auth::key_hash(&key))
                .await
                .unwrap();
            key
        }
    };
    let (operator, worker, admin) = (
        key("operator").await,
        key("worker").await,
        key("admin").await,
    );
    let config = Config {
        auth: AuthMode::Keys,
        ..test_config()
    };
    let app = TestApp::spawn_with(pool.clone(), config).await;
    let profile = json!({"burst": 20, "rate": 5, "capacity": 600,
                         "window_seconds": 60, "tenant_share": 0.5});
    for (caller, expected) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(&operator), StatusCode::FORBIDDEN),
        (Some(&worker), StatusCode::FORBIDDEN),
        (Some(&admin), StatusCode::OK),
    ] {
        let mut request = app
            .request(Method::PUT, "/v1/route-classes/public-apis")
            .json(&profile);
        if let Some(key) = caller {
            request = request.bearer_auth(key);
        }
        assert_eq!(
            request.send().await.unwrap().status(),
            expected,
            "PUT by {caller:?}"
        );
    }
    for (caller, expected) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(&operator), StatusCode::FORBIDDEN),
        (Some(&worker), StatusCode::NO_CONTENT),
        (Some(&admin), StatusCode::NO_CONTENT),
    ] {
        let mut request = app
            .get("/v1/admit")
            .header("X-Quota-Route-Class", "public-apis")
            .header("X-Quota-Principal", "alice")
            .header("X-Quota-Tenant", "acme");
        if let Some(key) = caller {
            request = request.bearer_auth(key);
        }
        assert_eq!(
            request.send().await.unwrap().status(),
            expected,
            "admit by {caller:?}"
        );
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn buckets_full_again_are_pruned_and_others_kept(pool: PgPool) {
    let first = pin_clock_at(&pool, 600.0).await;
    let app = TestApp::spawn(first).await;
    route_class(
        &app,
        "quick",
        json!({"burst": 1, "rate": 1, "capacity": 1000, "window_seconds": 60, "tenant_share": 1}),
    )
    .await;
    route_class(
        &app,
        "slow",
        json!({"burst": 1, "rate": 0.001, "capacity": 1000, "window_seconds": 60, "tenant_share": 1}),
    )
    .await;
    for class in ["quick", "slow"] {
        assert_eq!(
            admit(&app, Some(("alice", "acme")), class).await.status(),
            204
        );
    }
    // 30 s later the quick bucket is full (for 29 s), the slow one is not.
    let later = pin_clock_at(&pool, 630.0).await;
    let store = Store::new(later.clone());
    assert_eq!(
        store
            .prune_admit_buckets(Duration::from_secs(20), 100)
            .await
            .unwrap(),
        1
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM admit_bucket")
        .fetch_one(&later)
        .await
        .unwrap();
    assert_eq!(left, 1);
    // A window long over goes too.
    let next_hours = pin_clock_at(&pool, 600.0 + 3.0 * 3600.0).await;
    let pruned = Store::new(next_hours)
        .prune_admit_windows(Duration::from_secs(3600), 100)
        .await
        .unwrap();
    assert_eq!(pruned, 4, "two classes: their rows and their tenant's");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn no_log_line_names_a_principal_or_a_tenant(pool: PgPool) {
    let url = database_url(&pool, &postgres_host_port()).await;
    // Debug: every request's span and event, the admission's included.
    let replica = Replica::spawn_with(&url, &[("RUST_LOG", "debug")]).await;
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/v1/route-classes/public-apis", replica.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"burst": 1, "rate": 0.001, "capacity": 2,
                      "window_seconds": 3600, "tenant_share": 0.5}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    let mut statuses = Vec::new();
    for (principal, tenant) in [
        ("alice-7f3", "acme-corp-91"),
        ("alice-7f3", "acme-corp-91"),
        ("carol-2b8", "acme-corp-91"),
        ("bob-5d1", "globex-inc-44"),
    ] {
        let answer = client
            .get(format!("{}/v1/admit", replica.base))
            .header("X-Quota-Route-Class", "public-apis")
            .header("X-Quota-Principal", principal)
            .header("X-Quota-Tenant", tenant)
            .send()
            .await
            .unwrap();
        statuses.push(answer.status().as_u16());
    }
    // Admitted, its own limit, its tenant's share, the other tenant admitted.
    assert_eq!(statuses, [204, 429, 503, 204]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = replica.log_lines();
    assert!(
        logs.iter()
            .any(|line| line.contains(r#""route_class":"public-apis""#)),
        "the admissions were logged, with their route class: {logs:#?}"
    );
    for line in &logs {
        for identifier in [
            "alice-7f3",
            "carol-2b8",
            "bob-5d1",
            "acme-corp-91",
            "globex-inc-44",
        ] {
            assert!(!line.contains(identifier), "`{identifier}` logged: {line}");
        }
    }
}

/// Concurrent admissions on two replicas, decided in groups: still exact.
/// Capacity 60 an hour, no tenant above 40 % of it (24), no caller above its
/// burst of 3; 360 requests of 90 callers of 3 tenants, 48 at a time.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_admissions_are_decided_in_groups_and_stay_exact(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let url = database_url(&pool, &postgres_host_port()).await;
    let replicas = [Replica::spawn(&url).await, Replica::spawn(&url).await];
    let client = reqwest::Client::new();
    let profile = json!({"burst": 3, "rate": 0.001, "capacity": 60,
                         "window_seconds": 3600, "tenant_share": 0.4});
    let put = client
        .put(format!("{}/v1/route-classes/shared", replicas[0].base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&profile)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1500)).await; // the other replica's catalog

    let requests: Vec<(String, String, String)> = (0..360)
        .map(|i| {
            let base = replicas[i % 2].base.clone();
            (
                base,
                format!("caller-{}", i % 90),
                format!("tenant-{}", i % 3),
            )
        })
        .collect();
    let answers = at_most_at_once(requests, 48, |(base, principal, tenant)| {
        let client = client.clone();
        async move {
            let status = client
                .get(format!("{base}/v1/admit"))
                .header("X-Quota-Route-Class", "shared")
                .header("X-Quota-Principal", &principal)
                .header("X-Quota-Tenant", &tenant)
                .send()
                .await
                .unwrap()
                .status();
            (principal, tenant, status)
        }
    })
    .await;

    let admitted: Vec<&(String, String, StatusCode)> = answers
        .iter()
        .filter(|(_, _, status)| *status == StatusCode::NO_CONTENT)
        .collect();
    assert!(answers.iter().all(|(_, _, s)| {
        [
            StatusCode::NO_CONTENT,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
        ]
        .contains(s)
    }));
    // Every tenant wants 120 and may have 24: 3 × 24 = 72 > 60, so the
    // capacity binds first; nobody passes its share or its burst.
    assert_eq!(admitted.len(), 60, "exactly the capacity");
    for tenant in ["tenant-0", "tenant-1", "tenant-2"] {
        let n = admitted.iter().filter(|(_, t, _)| t == tenant).count();
        assert!(n <= 24, "{tenant} took {n} of 60");
    }
    for caller in 0..90 {
        let principal = format!("caller-{caller}");
        let n = admitted.iter().filter(|(p, _, _)| *p == principal).count();
        assert!(n <= 3, "{principal} admitted {n} times on a burst of 3");
    }
    let counted: i64 =
        sqlx::query_scalar("SELECT admitted FROM admit_window WHERE route_class = 'shared'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(counted, 60);
    let by_tenant: i64 = sqlx::query_scalar(
        "SELECT sum(admitted)::bigint FROM admit_tenant_window WHERE route_class = 'shared'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by_tenant, 60, "the tenants' counts add up to the class's");

    // Fewer statements than admissions: concurrent ones shared a statement.
    // Each replica answered half the requests, so ran at least one.
    let mut statements = 0.0;
    for replica in &replicas {
        let text = metrics_text(&client, &replica.base).await;
        let count = text
            .lines()
            .find_map(|line| line.strip_prefix("quota_admit_duration_seconds_count "))
            .expect("the admission statement's histogram");
        let count: f64 = count.trim().parse().unwrap();
        assert!(
            count >= 1.0,
            "{count} statements timed on a replica that admitted"
        );
        statements += count;
    }
    assert!(
        statements < 360.0,
        "{statements} statements for 360 admissions: none were grouped"
    );
}

/// Admission statements of one class running at once on their own
/// connections, not gathered (several replicas, or a group still in flight):
/// no limit is passed. Each statement decides a group of two callers; 16
/// connections, every task released together.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_admission_statements_of_one_class_never_pass_a_limit(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let store = Store::new(pool.clone());
    let class = |burst: f64, capacity: i64, tenant_share: f64| RouteClassSettings {
        burst,
        rate: 0.001,
        capacity,
        window_seconds: 3600,
        tenant_share,
        capacity_error_budget: 0.01,
    };
    // (class, its settings, how many groups, caller i's key, caller i's tenant)
    type Caller = fn(usize) -> (u8, String);
    let cases: [(&str, RouteClassSettings, usize, Caller, i64); 3] = [
        // 200 callers of 4 tenants against a capacity of 40.
        (
            "capacity",
            class(100.0, 40, 1.0),
            100,
            |i| ((i % 200) as u8, format!("t{}", i % 4)),
            40,
        ),
        // One tenant of 200 callers against its share of 1000 × 0.02 = 20.
        (
            "share",
            class(100.0, 1000, 0.02),
            100,
            |i| ((i % 200) as u8, "t".to_string()),
            20,
        ),
        // One caller against its burst of 5.
        (
            "burst",
            class(5.0, 1000, 1.0),
            100,
            |_| (7, "t".to_string()),
            5,
        ),
    ];
    for (name, settings, groups, caller, limit) in cases {
        store
            .put_route_class("test", name, &settings)
            .await
            .unwrap();
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(groups));
        let mut tasks = tokio::task::JoinSet::new();
        for g in 0..groups {
            let (store, settings, start) = (store.clone(), settings.clone(), start.clone());
            tasks.spawn(async move {
                let (mut keys, mut tenants) = (Vec::new(), Vec::new());
                for i in [2 * g, 2 * g + 1] {
                    let (key, tenant) = caller(i);
                    keys.push(vec![key; 32]);
                    tenants.push(tenant);
                }
                start.wait().await;
                let answers = store.admit(&keys, &tenants, name, &settings).await.unwrap();
                answers.iter().filter(|a| a.refused_by.is_none()).count() as i64
            });
        }
        let admitted: i64 = tasks.join_all().await.into_iter().sum();
        assert_eq!(
            admitted, limit,
            "{name}: admitted {admitted} on a limit of {limit}"
        );
        let counted: i64 =
            sqlx::query_scalar("SELECT admitted FROM admit_window WHERE route_class = $1")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(counted, limit, "{name}: the class's count");
    }
}

/// Runs `call` on every item, `limit` at a time; the answers in item order.
async fn at_most_at_once<T, F, Fut, R>(items: Vec<T>, limit: usize, call: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(limit));
    let mut tasks = Vec::with_capacity(items.len());
    for item in items {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let answer = call(item);
        tasks.push(tokio::spawn(async move {
            let answer = answer.await;
            drop(permit);
            answer
        }));
    }
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Each route class carries its own error budget for capacity refusals
/// (`capacity_error_budget`, 1 % unless set), exported for the alert that
/// compares each class's refusals with it; `null` restores the default.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn each_route_class_has_its_own_capacity_error_budget(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let profile = json!({"burst": 5, "rate": 1, "capacity": 100, "window_seconds": 60,
                         "tenant_share": 1});
    route_class(&app, "public-apis", profile.clone()).await;
    let mut shedding = profile.clone();
    shedding["capacity_error_budget"] = json!(0.1);
    route_class(&app, "batch-apis", shedding).await;
    let budget = |class: &'static str| {
        let app = &app;
        async move {
            let metrics = metrics_text(&app.client, &app.base).await;
            let series = format!("quota_admit_capacity_error_budget{{route_class=\"{class}\"}}");
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(&series)?.trim().parse::<f64>().ok())
        }
    };
    assert_eq!(budget("public-apis").await, Some(0.01));
    assert_eq!(budget("batch-apis").await, Some(0.1));

    let patched =
        patch_route_class(&app, "public-apis", r#"{"capacity_error_budget": 0.05}"#).await;
    assert_eq!(patched.status(), StatusCode::OK);
    let shown: Value = patched.json().await.unwrap();
    assert_eq!(shown["capacity_error_budget"], 0.05);
    assert_eq!(budget("public-apis").await, Some(0.05));
    let restored =
        patch_route_class(&app, "public-apis", r#"{"capacity_error_budget": null}"#).await;
    let shown: Value = restored.json().await.unwrap();
    assert_eq!(shown["capacity_error_budget"], 0.01);
    for bad in [
        r#"{"capacity_error_budget": 0}"#,
        r#"{"capacity_error_budget": 1.5}"#,
    ] {
        let refused = patch_route_class(&app, "public-apis", bad).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
}
