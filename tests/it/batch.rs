//! POST /v1/reserve/batch: rationing order, one take per quota, bypass first.

use chrono::{DateTime, Duration, Utc};
use quota_arbiter::decision::Outcome;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{create_flow, current_count, eventually, pin_clock, TestApp};

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT arbiter_now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn batch(app: &TestApp, items: Value) -> Vec<Value> {
    let response = app
        .client
        .post(format!("{}/v1/reserve/batch", app.base))
        .json(&json!({ "items": items }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["decisions"].as_array().unwrap().clone()
}

fn outcomes(decisions: &[Value]) -> Vec<(String, String)> {
    decisions
        .iter()
        .map(|d| {
            let reference = d["ref"].as_str().unwrap().to_string();
            (reference, d["outcome"].as_str().unwrap().to_string())
        })
        .collect()
}

#[sqlx::test]
async fn ten_items_four_slots_left_go_to_the_earliest_deadlines(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 6, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 6, "urgent", "enforce").await;
    sqlx::query("UPDATE flow SET priority = 1 WHERE name = 'urgent'")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    for _ in 0..2 {
        assert_eq!(
            app.reserve(json!({"flow": "invoice"})).await.outcome,
            Outcome::Granted
        );
    }
    let now = db_now(&pool).await;
    let at = |minutes: i64| now + Duration::minutes(minutes);
    let decisions = batch(
        &app,
        json!([
            {"ref": "a", "flow": "invoice", "deadline": at(180)},
            {"ref": "b", "flow": "invoice"},
            {"ref": "c", "flow": "invoice", "deadline": at(60)},
            {"ref": "d", "flow": "invoice", "deadline": at(5)},
            {"ref": "e", "flow": "invoice", "deadline": at(120)},
            {"ref": "f", "flow": "urgent"},
            {"ref": "g", "flow": "invoice", "deadline": at(30)},
            {"ref": "h", "flow": "invoice", "deadline": at(-1)},
            {"ref": "i", "flow": "invoice", "deadline": at(240)},
            {"ref": "j", "flow": "urgent", "deadline": at(60)},
        ]),
    )
    .await;
    let expected = [
        ("a", "deferred"),
        ("b", "deferred"),
        ("c", "granted"),
        ("d", "bypassed"),
        ("e", "granted"),
        ("f", "deferred"),
        ("g", "granted"),
        ("h", "bypassed"),
        ("i", "deferred"),
        ("j", "granted"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(r, o)| (r.to_string(), o.to_string()))
        .collect();
    assert_eq!(outcomes(&decisions), expected, "answers in input order");
    let deferred = &decisions[0];
    assert_eq!(deferred["quota"], "ppf");
    assert!(deferred["retry_at"].is_string() && deferred["retry_after_seconds"].is_i64());
    // 2 + 4 reserved; the 2 bypassed are counted after the fact.
    let counted = eventually(std::time::Duration::from_secs(5), 8, || {
        current_count(&pool, "ppf")
    })
    .await;
    assert_eq!(counted, 8);

    // Window full: deadline work still bypasses, without the reservation.
    let decisions = batch(
        &app,
        json!([
            {"ref": "k", "flow": "invoice"},
            {"ref": "l", "flow": "urgent", "deadline": at(2)},
            {"ref": "m", "flow": "invoice", "deadline": at(90)},
        ]),
    )
    .await;
    assert_eq!(
        outcomes(&decisions),
        [("k", "deferred"), ("l", "bypassed"), ("m", "deferred")]
            .map(|(r, o)| (r.to_string(), o.to_string()))
    );
}

#[sqlx::test]
async fn items_are_all_or_nothing_and_unused_slots_are_given_back(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 3, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let decisions = batch(
        &app,
        json!([
            {"ref": "x", "flow": "invoice", "count": 2},
            {"ref": "y", "flow": "invoice", "count": 2},
        ]),
    )
    .await;
    assert_eq!(
        outcomes(&decisions),
        [("x", "granted"), ("y", "deferred")].map(|(r, o)| (r.to_string(), o.to_string()))
    );
    assert_eq!(
        current_count(&pool, "ppf").await,
        2,
        "the third slot was given back"
    );
    // A smaller item later in the order may still use what is left.
    let decisions = batch(
        &app,
        json!([
            {"ref": "p", "flow": "invoice", "count": 2},
            {"ref": "q", "flow": "invoice", "count": 1},
        ]),
    )
    .await;
    assert_eq!(
        outcomes(&decisions),
        [("p", "deferred"), ("q", "granted")].map(|(r, o)| (r.to_string(), o.to_string()))
    );
    assert_eq!(current_count(&pool, "ppf").await, 3);
}

#[sqlx::test]
async fn concurrent_batches_never_over_grant(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 25, "invoice", "enforce").await;
    let app = std::sync::Arc::new(TestApp::spawn(pool.clone()).await);
    let items: Vec<Value> = (0..10)
        .map(|i| json!({"ref": format!("r{i}"), "flow": "invoice"}))
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (app, items) = (app.clone(), json!(items));
            tokio::spawn(async move { batch(&app, items).await })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        granted += task
            .await
            .unwrap()
            .iter()
            .filter(|d| d["outcome"] == "granted")
            .count();
    }
    assert_eq!(
        granted, 25,
        "exactly the ceiling across 80 concurrent items"
    );
    assert_eq!(current_count(&pool, "ppf").await, 25);
}

#[sqlx::test]
async fn observe_count_and_unknown_flows_behave_as_in_reserve(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1, "report", "observe").await;
    create_flow(&pool, "ppf", 1, "ack", "count").await;
    let app = TestApp::spawn(pool.clone()).await;
    let decisions = batch(
        &app,
        json!([
            {"ref": "o1", "flow": "report"},
            {"ref": "o2", "flow": "report"},
            {"ref": "c1", "flow": "ack", "count": 3},
            {"ref": "u1", "flow": "nobody-knows"},
        ]),
    )
    .await;
    assert_eq!(
        outcomes(&decisions),
        [
            ("o1", "granted"),
            ("o2", "granted"),
            ("c1", "unthrottled"),
            ("u1", "unthrottled")
        ]
        .map(|(r, o)| (r.to_string(), o.to_string()))
    );
    let flags: Vec<&Value> = decisions.iter().map(|d| &d["would_defer"]).collect();
    assert_eq!(flags, [false, true, false, false]);
    assert_eq!(decisions[3]["quota"], Value::Null);
    let counted = eventually(std::time::Duration::from_secs(5), 5, || {
        current_count(&pool, "ppf")
    })
    .await;
    assert_eq!(counted, 5, "2 observed + 3 counted after the fact");
}

#[sqlx::test]
async fn a_bad_batch_is_refused_whole(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let post = |body: Value| {
        app.client
            .post(format!("{}/v1/reserve/batch", app.base))
            .json(&body)
            .send()
    };
    let too_many: Vec<Value> = (0..501).map(|_| json!({"flow": "invoice"})).collect();
    for body in [
        json!({"items": []}),
        json!({"items": too_many}),
        json!({"items": [{"flow": "invoice"}, {"flow": "invoice", "count": 0}]}),
        json!({"items": [{"flow": "invoice", "extra": 1}]}),
    ] {
        assert_eq!(post(body).await.unwrap().status(), 422);
    }
}
