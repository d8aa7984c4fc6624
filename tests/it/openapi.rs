//! The OpenAPI document is derived from the mounted routes; every documented
//! operation must answer on the live server (never 404/405).

use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::TestApp;

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_documented_operation_is_served(pool: PgPool) {
    // An item with id 1, so that GET /v1/work/{id} has something to answer.
    sqlx::query("INSERT INTO work_item (flow, priority, payload) VALUES ('x', 2, '{}')")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool).await;
    let served: serde_json::Value = app
        .get("/openapi.json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let spec = serde_json::to_value(quota_arbiter::http::openapi()).unwrap();
    assert_eq!(served, spec, "the served document is the derived one");

    let paths = spec["paths"].as_object().unwrap();
    for expected in [
        "/v1/reserve",
        "/v1/reserve/batch",
        "/v1/work",
        "/v1/work/claim",
        "/v1/work/{id}",
        "/v1/work/{id}/done",
        "/v1/work/{id}/release",
        "/v1/quotas",
        "/v1/quotas/{name}",
        "/v1/flows",
        "/v1/flows/{name}",
        "/v1/windows",
        "/v1/admit",
        "/v1/route-classes",
        "/v1/route-classes/{name}",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/report",
        "/",
    ] {
        assert!(paths.contains_key(expected), "{expected} is documented");
    }
    for (path, operations) in paths {
        for method in operations.as_object().unwrap().keys() {
            let method: Method = method.to_uppercase().parse().unwrap();
            let url = format!(
                "{}{}",
                app.base,
                path.replace("{name}", "x").replace("{id}", "1")
            );
            let response = app
                .admin(method.clone(), &url[app.base.len()..])
                .send()
                .await
                .unwrap();
            let status = response.status();
            // A 404 about the resource (no quota `x`) is fine; one about the route is not.
            let body = response.text().await.unwrap_or_default();
            assert!(
                status != 405 && !(status == 404 && body.contains("no such resource")),
                "{method} {path} answered {status}: {body}"
            );
        }
    }
}

/// Every failure of the JSON API is documented as what it is: a problem
/// document, with `Retry-After` on a 503; what a shared extractor can answer
/// is documented on every operation that uses it.
#[test]
fn every_failure_is_documented_as_a_problem() {
    let spec = serde_json::to_value(quota_arbiter::http::openapi()).unwrap();
    let problem = json!({"$ref": "#/components/schemas/Problem"});
    for (path, operations) in spec["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for (method, operation) in operations.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            let mut expected = vec!["500", "503"];
            if operation.get("requestBody").is_some() {
                expected.extend(["400", "413", "415", "422"]);
            }
            if operation.get("security").is_some() {
                expected.extend(["401", "403"]);
            }
            for status in expected {
                assert!(responses.contains_key(status), "{method} {path}: {status}");
            }
            for (status, response) in responses {
                if !status.starts_with(['4', '5']) {
                    continue;
                }
                let content = response["content"].as_object().unwrap();
                assert_eq!(content.len(), 1, "{method} {path} {status}");
                assert_eq!(
                    content["application/problem+json"]["schema"], problem,
                    "{method} {path} {status}"
                );
            }
            assert!(
                responses["503"]["headers"].get("Retry-After").is_some(),
                "{method} {path}: 503 says when to retry"
            );
        }
    }
}

/// `/v1/reserve` and its batch declare their RateLimit fields (headers only: the decision's
/// schema is unchanged, design.md §4).
#[test]
fn reserve_declares_its_ratelimit_fields_and_no_new_body_field() {
    let spec = serde_json::to_value(quota_arbiter::http::openapi()).unwrap();
    let headers = &spec["paths"]["/v1/reserve"]["post"]["responses"]["200"]["headers"];
    for name in ["Retry-After", "RateLimit-Policy", "RateLimit"] {
        assert!(headers.get(name).is_some(), "{name} declared: {headers}");
    }
    let batch = &spec["paths"]["/v1/reserve/batch"]["post"]["responses"]["200"]["headers"];
    for name in ["RateLimit-Policy", "RateLimit"] {
        assert!(batch.get(name).is_some(), "{name} declared: {batch}");
    }
    let decision = &spec["components"]["schemas"]["Decision"]["properties"];
    assert!(decision.get("outcome").is_some(), "{decision}");
    assert!(decision.get("quota_limit").is_none(), "{decision}");
}

/// A route class's window is declared as what the API accepts: an integer
/// that divides an hour, each divisor listed, so a generated client offers
/// exactly the lengths a PUT or PATCH is not refused for.
#[test]
fn a_route_class_window_is_declared_as_the_divisors_of_an_hour() {
    let spec = serde_json::to_value(quota_arbiter::http::openapi()).unwrap();
    let schemas = &spec["components"]["schemas"];
    for schema in ["RouteClassSettings", "RouteClassPatch"] {
        let window = &schemas[schema]["properties"]["window_seconds"];
        assert_eq!(window["type"], "integer", "{schema}: {window}");
        let listed: Vec<i64> = window["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema}: an enum of lengths: {window}"))
            .iter()
            .map(|n| n.as_i64().unwrap())
            .collect();
        let divisors: Vec<i64> = (1..=3600).filter(|n| 3600 % n == 0).collect();
        assert_eq!(listed, divisors, "{schema}");
    }
}
