//! Work items that spend (design.md §12): an item with a `spend`, and every
//! item of a flow that spends several quotas, is decided when claimed the
//! way a reservation with that `spend` is: all or nothing across every
//! window of every quota, coalesced with concurrent claims and
//! reservations, and granted with a `reservation_id` to settle.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Duration;
use quota_arbiter::domain::decision::{Limit, Outcome};
use quota_arbiter::store::WorkItem;
use quota_arbiter::work_registry::{Claim, ClaimOutcome};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{db_now, pin_clock, TestApp};
use crate::several::llm as llm_quotas;

async fn enqueue(app: &TestApp, body: Value) -> reqwest::Response {
    app.post("/v1/work").json(&body).send().await.unwrap()
}

async fn enqueued(app: &TestApp, body: Value) -> WorkItem {
    let response = enqueue(app, body).await;
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

async fn claim(app: &TestApp, body: Value) -> Claim {
    let response = app.post("/v1/work/claim").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Each window's count, by quota and period.
async fn counts(pool: &PgPool) -> BTreeMap<(String, String), i64> {
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT quota, period, count FROM quota_window")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().map(|(q, p, c)| ((q, p), c)).collect()
}

fn window(quota: &str, period: &str) -> (String, String) {
    (quota.to_string(), period.to_string())
}

/// Three replicas and eight workers claim the items of a flow that spends
/// requests and tokens, 150 tokens an item: the tokens' minute (1000) lets
/// exactly 6 through, every window of both quotas counts exactly those 6,
/// and the rest are deferred by the tokens' minute. A smaller, more urgent
/// item still fits in what is left (first fit, in rationing order).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn claims_spend_every_quota_an_item_names_or_none(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm_quotas(&app, 50, 500, 1000, "enforce").await;
    for n in 0..20 {
        let body = json!({"flow": "chat", "ref": format!("c{n}"), "spend": {"llm-tokens": 150}});
        assert_eq!(
            enqueued(&app, body).await.spend,
            Some(json!({"llm-tokens": 150}))
        );
    }
    let replicas = [
        Arc::new(TestApp::spawn(pool.clone()).await),
        Arc::new(TestApp::spawn(pool.clone()).await),
        Arc::new(TestApp::spawn(pool.clone()).await),
    ];
    let claims: Vec<_> = (0..8)
        .map(|w| {
            let app = replicas[w % 3].clone();
            tokio::spawn(async move {
                let mut items = Vec::new();
                for _ in 0..3 {
                    let body = json!({"worker": format!("w{w}"), "flows": ["chat"], "max": 3});
                    items.extend(claim(&app, body).await.items);
                }
                items
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for worker in claims {
        claimed.extend(worker.await.unwrap());
    }
    assert_eq!(claimed.len(), 6, "1000 tokens a minute, 150 an item");
    for item in &claimed {
        let decision = &item.decision;
        assert_eq!(decision.outcome, Outcome::Granted);
        assert!(decision.reservation_id.is_some(), "a spend is settled");
        let quotas: Vec<&str> = decision
            .windows
            .as_ref()
            .unwrap()
            .iter()
            .map(|w| w.quota.as_str())
            .collect();
        assert_eq!(quotas, ["llm-requests", "llm-requests", "llm-tokens"]);
        assert_eq!(item.item.outcome.as_deref(), Some("granted"));
    }
    let spent = counts(&pool).await;
    assert_eq!(spent[&window("llm-requests", "1m")], 6);
    assert_eq!(spent[&window("llm-requests", "1d")], 6);
    assert_eq!(spent[&window("llm-tokens", "1m")], 900);

    let deferred = claim(&app, json!({"worker": "late", "flows": ["chat"]})).await;
    assert_eq!(deferred.outcome, ClaimOutcome::Deferred);
    assert_eq!(deferred.limit, Some(Limit::Budget));
    let minute_end = db_now(&pool).await + Duration::minutes(1);
    assert!(deferred.retry_at.unwrap() <= minute_end, "{deferred:?}");

    let small = json!({"flow": "chat", "priority": 1, "spend": {"llm-tokens": 100}});
    let small = enqueued(&app, small).await;
    let fits = claim(&app, json!({"worker": "late", "flows": ["chat"], "max": 5})).await;
    let ids: Vec<i64> = fits.items.iter().map(|c| c.item.id).collect();
    assert_eq!(ids, [small.id], "only the 100 fits in the 100 left");
    assert_eq!(counts(&pool).await[&window("llm-tokens", "1m")], 1000);
}

/// An item with a `spend` of a one-quota flow is claimed for what it
/// spends, beside items without one (a slot each, from the lane's take);
/// settling it gives back to the window, and the next item fits.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_item_of_one_quota_spends_what_it_names_and_settles(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    let tokens = json!({"windows": [{"period": "1h", "ceiling": 1000}]});
    app.admin_json(Method::PUT, "/v1/quotas/tokens", Some(tokens))
        .await;
    let flow = json!({"quota": "tokens", "mode": "enforce"});
    app.admin_json(Method::PUT, "/v1/flows/summarize", Some(flow))
        .await;
    for _ in 0..2 {
        enqueued(&app, json!({"flow": "summarize"})).await;
    }
    let mut big = Vec::new();
    for _ in 0..3 {
        let body = json!({"flow": "summarize", "spend": {"tokens": 400}});
        big.push(enqueued(&app, body).await.id);
    }
    for refused in [
        json!({"flow": "summarize", "spend": {"other": 4}}),
        json!({"flow": "summarize", "spend": {"tokens": 0}}),
        json!({"flow": "summarize", "spend": {}}),
    ] {
        assert_eq!(
            enqueue(&app, refused.clone()).await.status(),
            422,
            "{refused}"
        );
    }

    let first = claim(&app, json!({"worker": "w", "max": 10})).await;
    let outcomes: Vec<(Option<i64>, Outcome)> = first
        .items
        .iter()
        .map(|c| {
            (
                c.decision.reservation_id.map(|_| c.item.id),
                c.decision.outcome,
            )
        })
        .collect();
    assert_eq!(first.items.len(), 4, "{outcomes:?}");
    assert_eq!(
        outcomes
            .iter()
            .filter(|(settle, _)| settle.is_some())
            .count(),
        2,
        "two of 400 fit beside the two single slots: {outcomes:?}"
    );
    let count = || async { counts(&pool).await[&window("tokens", "1h")] };
    assert_eq!(count().await, 802);

    let settled = first
        .items
        .iter()
        .find_map(|c| c.decision.reservation_id)
        .unwrap();
    let answer = app
        .post("/v1/settle")
        .json(&json!({"reservation_id": settled.to_string(), "spent": {"tokens": 100}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(count().await, 502);
    let next = claim(&app, json!({"worker": "w", "max": 10})).await;
    let ids: Vec<i64> = next.items.iter().map(|c| c.item.id).collect();
    assert_eq!(ids, [big[2]]);
    assert_eq!(count().await, 902);
}

/// Observe mode: every item is granted and spent whatever the counts, and
/// those over a window say enforcement would have deferred them.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn observed_items_that_spend_several_quotas_are_spent_regardless(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm_quotas(&app, 2, 100, 1000, "observe").await;
    for _ in 0..3 {
        enqueued(&app, json!({"flow": "chat", "spend": {"llm-tokens": 10}})).await;
    }
    let claimed = claim(&app, json!({"worker": "w", "max": 3})).await;
    let would_defer: Vec<bool> = claimed
        .items
        .iter()
        .map(|c| c.decision.would_defer)
        .collect();
    assert_eq!(
        would_defer,
        [false, false, true],
        "the requests' minute holds 2"
    );
    let spent = counts(&pool).await;
    assert_eq!(spent[&window("llm-requests", "1m")], 3);
    assert_eq!(spent[&window("llm-tokens", "1m")], 30);
}

/// A flow with work not done may move from one quota to two: its pending
/// items are then claimed spending both.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_flow_with_pending_work_moves_to_two_quotas(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    llm_quotas(&app, 10, 100, 1000, "enforce").await;
    let flow = json!({"quota": "llm-requests", "mode": "enforce"});
    app.admin_json(Method::PUT, "/v1/flows/mail", Some(flow))
        .await;
    let item = enqueued(&app, json!({"flow": "mail"})).await;
    let moved = app
        .admin(Method::PUT, "/v1/flows/mail")
        .json(&json!({"quotas": ["llm-requests", "llm-tokens"], "mode": "enforce"}))
        .send()
        .await
        .unwrap();
    assert_eq!(moved.status(), 200);
    let claimed = claim(&app, json!({"worker": "w", "flows": ["mail"]})).await;
    assert_eq!(claimed.items.len(), 1);
    assert_eq!(claimed.items[0].item.id, item.id);
    let spent = counts(&pool).await;
    assert_eq!(spent[&window("llm-requests", "1m")], 1);
    assert_eq!(spent[&window("llm-tokens", "1m")], 1);
}
