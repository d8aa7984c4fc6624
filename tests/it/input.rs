//! Bad input is a 4xx at the edge: a NUL, a control character, a lone
//! surrogate or an over-long value is a 422 problem document naming the
//! field, and the store never sees it (nothing is written, nothing fails
//! there as an outage).

use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{create_flow, TestApp};

/// Sends `body` as it is written (so that escapes reach the server as JSON
/// text), and expects a 422 problem document whose detail names `field`.
async fn refused(app: &TestApp, method: Method, path: &str, body: &str, field: &str) {
    let response = app
        .admin(method.clone(), path)
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let content_type = response.headers()[CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    let problem: Value = response.json().await.unwrap();
    assert_eq!(status, 422, "{method} {path} {body}: {problem}");
    assert_eq!(content_type, "application/problem+json");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains(field),
        "{method} {path}: `{detail}` names {field}"
    );
}

async fn enqueue(app: &TestApp, body: Value) -> i64 {
    let response = app.post("/v1/work").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 201, "{body}");
    let item: Value = response.json().await.unwrap();
    item["id"].as_i64().unwrap()
}

async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_nul_anywhere_is_refused_before_the_store(pool: PgPool) {
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let id = enqueue(&app, json!({"flow": "invoice", "payload": {"n": 1}})).await;
    app.post_json("/v1/work/claim", json!({"worker": "w-1"}))
        .await;

    let done = format!("/v1/work/{id}/done");
    let release = format!("/v1/work/{id}/release");
    for (path, body, field) in [
        (&*done, r#"{"worker": "w\u0000-1"}"#, "`worker`"),
        (&*release, r#"{"worker": "w\u0000"}"#, "`worker`"),
        (
            &*release,
            r#"{"worker": "w-1", "retry_in": "30\u0000s"}"#,
            "`retry_in`",
        ),
        (
            "/v1/work",
            r#"{"flow": "invoice", "payload": {"a": [1, {"b": "x\u0000y"}]}}"#,
            "`payload`",
        ),
        (
            "/v1/work",
            r#"{"flow": "invoice", "payload": {"k\u0000": 1}}"#,
            "`payload`",
        ),
        (
            "/v1/reserve",
            r#"{"flow": "invoice", "ref": "a\u0000b"}"#,
            "`ref`",
        ),
    ] {
        refused(&app, Method::POST, path, body, field).await;
    }

    let state: String = sqlx::query_scalar("SELECT state FROM work_item WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "claimed", "the item was neither done nor released");
    assert_eq!(rows(&pool, "work_item").await, 1, "no payload was stored");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn control_characters_in_names_and_refs_are_refused(pool: PgPool) {
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for (path, body, field) in [
        ("/v1/reserve", r#"{"flow": "inv\u001boice"}"#, "`flow`"),
        ("/v1/reserve", r#"{"flow": "invoice\n"}"#, "`flow`"),
        (
            "/v1/reserve",
            r#"{"flow": "invoice", "ref": "r\r\n1"}"#,
            "`ref`",
        ),
        (
            "/v1/reserve",
            r#"{"flow": "invoice", "ref": "r\u0085"}"#,
            "`ref`",
        ),
        (
            "/v1/reserve/batch",
            r#"{"items": [{"flow": "invoice", "ref": "\u001b[2J"}]}"#,
            "`ref`",
        ),
        (
            "/v1/work",
            r#"{"flow": "invoice", "ref": "r\t", "payload": {}}"#,
            "`ref`",
        ),
        ("/v1/work/claim", r#"{"worker": "w\u0007"}"#, "`worker`"),
        (
            "/v1/report",
            r#"{"flow": "in\u0000voice", "status": 200}"#,
            "`flow`",
        ),
    ] {
        refused(&app, Method::POST, path, body, field).await;
    }
    refused(
        &app,
        Method::PUT,
        "/v1/flows/bad%0Aname",
        r#"{"quota": "ppf"}"#,
        "flow name",
    )
    .await;
    refused(
        &app,
        Method::PUT,
        "/v1/flows/other",
        r#"{"quota": "pp\u0000f"}"#,
        "`quota`",
    )
    .await;
    assert_eq!(rows(&pool, "quota_window").await, 0, "nothing was decided");
    assert_eq!(rows(&pool, "work_item").await, 0);
    assert_eq!(rows(&pool, "flow").await, 1, "only `invoice`");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn over_long_values_are_refused_and_lengths_are_characters(pool: PgPool) {
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let long_flow = "f".repeat(129);
    let long_ref = "r".repeat(257);
    let long_worker = "w".repeat(129);
    for (path, body, field) in [
        ("/v1/reserve", json!({"flow": long_flow}), "`flow`"),
        (
            "/v1/reserve",
            json!({"flow": "invoice", "ref": long_ref}),
            "`ref`",
        ),
        ("/v1/work/claim", json!({"worker": long_worker}), "`worker`"),
        (
            "/v1/work",
            json!({"flow": "invoice", "payload": {"blob": "x".repeat(9000)}}),
            "`payload`",
        ),
        (
            "/v1/work",
            json!({"flow": "invoice", "payload": [1e301]}),
            "`payload`",
        ),
    ] {
        refused(&app, Method::POST, path, &body.to_string(), field).await;
    }
    assert_eq!(rows(&pool, "quota_window").await, 0);
    assert_eq!(rows(&pool, "work_item").await, 0);

    // The document's maxLength counts characters: 256 of them, 512 bytes, fit.
    let decision = app
        .reserve(json!({"flow": "invoice", "ref": "é".repeat(256)}))
        .await;
    assert_eq!(decision.flow, "invoice");
    // The largest payload number reads back as it was written.
    let id = enqueue(&app, json!({"flow": "invoice", "payload": [1e300, -1e300]})).await;
    let read: Value = app
        .get(&format!("/v1/work/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["payload"], json!([1e300, -1e300]));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_lone_surrogate_is_invalid_input_not_a_malformed_body(pool: PgPool) {
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for body in [
        r#"{"flow": "invoice", "ref": "a\ud800b"}"#,
        r#"{"flow": "invoice", "ref": "\udc00"}"#,
    ] {
        refused(&app, Method::POST, "/v1/reserve", body, "surrogate").await;
    }
    refused(
        &app,
        Method::POST,
        "/v1/work",
        r#"{"flow": "invoice", "payload": {"k": "\ud83d"}}"#,
        "surrogate",
    )
    .await;
    // A whole pair is one character, and fine.
    let decision = app
        .reserve(serde_json::from_str(r#"{"flow": "invoice", "ref": "\ud83d\ude00"}"#).unwrap())
        .await;
    assert_eq!(decision.flow, "invoice");
    assert_eq!(rows(&pool, "work_item").await, 0);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_body_is_an_object_and_integers_may_have_a_zero_fraction(pool: PgPool) {
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    // serde would read a struct from an array: `[null, null]` as a patch.
    refused(
        &app,
        Method::PATCH,
        "/v1/quotas/ppf",
        "[null, null]",
        "object",
    )
    .await;
    refused(
        &app,
        Method::POST,
        "/v1/reserve",
        r#"["invoice"]"#,
        "object",
    )
    .await;
    refused(
        &app,
        Method::POST,
        "/v1/reserve",
        r#"{"flow": "invoice", "count": 2.5}"#,
        "count",
    )
    .await;
    // JSON Schema's integer 3 may be written 3.0.
    let decision = app.reserve(json!({"flow": "invoice", "count": 3.0})).await;
    assert_eq!(
        decision.outcome,
        quota_arbiter::domain::decision::Outcome::Granted
    );
    assert_eq!(crate::helpers::current_count(&pool, "ppf").await, 3);
}
