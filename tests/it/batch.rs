//! POST /v1/reserve/batch: rationing order, one take per quota, bypass first.

use chrono::Duration;
use quota_arbiter::domain::catalog::MAX_NAME_LEN;
use quota_arbiter::domain::decision::{Outcome, MAX_COUNT, MAX_REF_LEN};
use quota_arbiter::http::{MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES};
use quota_arbiter::reservations::MAX_BATCH_ITEMS;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, db_now, eventually, header_once, pin_clock, set_limits, TestApp,
};

async fn batch(app: &TestApp, items: Value) -> Vec<Value> {
    let response = app
        .post("/v1/reserve/batch")
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

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
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

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
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

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
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

/// Observe mode says what enforcement would have done, and enforcement
/// rations a batch by deadline first: the items that would have been
/// deferred are the least urgent, wherever they stand in the batch.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_observed_batch_would_defer_its_least_urgent_items(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 2, "report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    let now = db_now(&pool).await;
    // Hours away: none is due, so none is bypassed.
    let at = |hours: i64| (now + Duration::hours(hours)).to_rfc3339();
    let decisions = batch(
        &app,
        json!([
            {"ref": "none", "flow": "report"},
            {"ref": "in 3 h", "flow": "report", "deadline": at(3)},
            {"ref": "in 2 h", "flow": "report", "deadline": at(2)},
        ]),
    )
    .await;
    let flags: Vec<(&Value, &Value)> = decisions
        .iter()
        .map(|d| (&d["ref"], &d["would_defer"]))
        .collect();
    assert_eq!(
        flags,
        [
            (&json!("none"), &json!(true)),
            (&json!("in 3 h"), &json!(false)),
            (&json!("in 2 h"), &json!(false)),
        ]
    );
    assert!(decisions.iter().all(|d| d["outcome"] == "granted"));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
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

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_bad_batch_is_refused_whole(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let post = |body: Value| app.post("/v1/reserve/batch").json(&body).send();
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

/// A `/v1/reserve` body answered alone and as the only item of a batch, in
/// the same situation: every field of the two decisions, compared.
async fn assert_batch_answers_like_reserve(app: &TestApp, body: Value) {
    let single: Value = app.post_json("/v1/reserve", body.clone()).await;
    let mut item = batch(app, json!([body])).await.remove(0);
    let echoed = item.as_object_mut().unwrap().remove("ref").unwrap();
    assert_eq!(echoed, body.get("ref").cloned().unwrap_or(Value::Null));
    let (single, item) = (single.as_object().unwrap(), item.as_object().unwrap());
    let fields = |d: &serde_json::Map<String, Value>| d.keys().cloned().collect::<Vec<_>>();
    assert_eq!(fields(item), fields(single), "{body}: the same fields");
    for (field, alone) in single {
        let batched = &item[field];
        match field.as_str() {
            // Counted down from a moment later: a second less at most.
            "retry_after_seconds" => {
                let (a, b) = (alone.as_i64(), batched.as_i64());
                assert_eq!(a.is_some(), b.is_some(), "{body}: {field}");
                assert!(
                    a.zip(b).is_none_or(|(a, b)| (a - b).abs() <= 1),
                    "{body}: {field}"
                );
            }
            // Each grant holds a concurrency lease of its own.
            "lease_id" | "valid_until" => {
                assert_eq!(alone.is_null(), batched.is_null(), "{body}: {field}")
            }
            // The same windows, each with what was left after the decision:
            // the batch came second, so no more than after the single one.
            "windows" => {
                let without_left = |windows: &Value| {
                    let mut windows = windows.clone();
                    for window in windows.as_array_mut().into_iter().flatten() {
                        window.as_object_mut().unwrap().remove("left");
                    }
                    windows
                };
                assert_eq!(
                    without_left(batched),
                    without_left(alone),
                    "{body}: {field}"
                );
                let lefts = |windows: &Value| -> Vec<Option<i64>> {
                    let windows = windows.as_array().cloned().unwrap_or_default();
                    windows.iter().map(|w| w["left"].as_i64()).collect()
                };
                for (b, a) in lefts(batched).into_iter().zip(lefts(alone)) {
                    assert!(b.zip(a).is_none_or(|(b, a)| b <= a), "{body}: {field}");
                }
            }
            _ => assert_eq!(batched, alone, "{body}: {field}"),
        }
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_batch_item_answers_field_by_field_like_a_single_reservation(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    // Full windows, one flow per path a batch item can take.
    create_flow(&pool, "full", 1, "full", "enforce").await;
    create_flow(&pool, "closed", 0, "closed", "enforce").await;
    create_flow(&pool, "headroom", 2, "batchy", "enforce").await;
    set_limits(&pool, "headroom", "priority3_share = 50").await;
    create_flow(&pool, "slots", 100, "slotted", "enforce").await;
    set_limits(&pool, "slots", "max_in_flight = 1").await;
    create_flow(&pool, "rollout", 1, "rollout", "enforce").await;
    create_flow(&pool, "watched", 1, "watched", "observe").await;
    create_flow(&pool, "paced", 100, "paced", "observe").await;
    set_limits(&pool, "paced", "rate = 0.01, burst = 1, adaptive = false").await;
    create_flow(&pool, "open", 1000, "open", "enforce").await;
    create_flow(&pool, "counted", 1000, "counted", "count").await;
    sqlx::query("UPDATE flow SET priority = 3 WHERE name = 'batchy'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE flow SET enforce_percent = 50 WHERE name = 'rollout'")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    for flow in ["full", "batchy", "slotted", "rollout", "watched", "paced"] {
        app.reserve(json!({"flow": flow})).await;
    }
    let soon = db_now(&pool).await + Duration::minutes(1);
    let mut bodies = vec![
        json!({"flow": "full", "ref": "coalesced-take"}),
        json!({"flow": "closed"}),
        json!({"flow": "batchy", "ref": "headroom"}),
        json!({"flow": "slotted"}),
        json!({"flow": "watched", "count": 2}),
        json!({"flow": "paced"}),
        json!({"flow": "open", "count": 3}),
        json!({"flow": "counted"}),
        json!({"flow": "nobody-knows"}),
        json!({"flow": "full", "deadline": soon}),
    ];
    // Enforced for half of the refusals: a ref always gets the same answer.
    bodies.extend((0..8).map(|i| json!({"flow": "rollout", "ref": format!("r-{i}")})));
    for body in bodies {
        assert_batch_answers_like_reserve(&app, body).await;
    }
    // The situations were the ones meant.
    let full = batch(&app, json!([{"flow": "full"}])).await;
    assert_eq!(
        (&full[0]["outcome"], &full[0]["limit"]),
        (&json!("deferred"), &json!("budget"))
    );
    let paced = batch(&app, json!([{"flow": "paced"}])).await;
    assert_eq!(
        (&paced[0]["would_defer"], &paced[0]["limit"]),
        (&json!(true), &json!("cadence"))
    );
    let rollout: Vec<Value> = batch(
        &app,
        json!((0..8)
            .map(|i| json!({"flow": "rollout", "ref": format!("r-{i}")}))
            .collect::<Vec<_>>()),
    )
    .await;
    let deferred = rollout
        .iter()
        .filter(|d| d["outcome"] == "deferred")
        .count();
    assert!(
        (1..8).contains(&deferred),
        "some refusals deferred, the others granted as observed: {deferred}"
    );
}

/// Refs of `MAX_REF_LEN` bytes and flows of `MAX_NAME_LEN` characters, every
/// character of them written as a `\u00XX` escape, deadlines with nanoseconds
/// and an offset, pretty-printed: the largest batch a caller can write.
fn largest_batch_body(items: usize, flow: &str) -> String {
    let escaped = |text: &str| -> String { text.bytes().map(|b| format!("\\u{b:04x}")).collect() };
    let indent = "\n        ";
    let lines: Vec<String> = (0..items)
        .map(|i| {
            let reference = format!("{i:0>width$}", width = MAX_REF_LEN);
            format!(
                "{indent}{{{indent}\"ref\": \"{}\",{indent}\"flow\": \"{}\",{indent}\"count\": {MAX_COUNT},{indent}\"deadline\": \"2099-12-31T23:59:59.999999999+05:30\"{indent}}}",
                escaped(&reference),
                escaped(flow)
            )
        })
        .collect();
    format!(
        "{{{indent}\"items\": [{}{indent}]{indent}}}",
        lines.join(",")
    )
}

async fn post_raw(app: &TestApp, path: &str, body: String) -> reqwest::Response {
    app.post(path)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_largest_batch_fits_and_one_byte_more_is_too_large(pool: PgPool) {
    let flow = "f".repeat(MAX_NAME_LEN);
    create_flow(&pool, "ppf", 1_000_000_000, &flow, "enforce").await;
    let app = TestApp::spawn(pool).await;
    let largest = largest_batch_body(MAX_BATCH_ITEMS, &flow);
    assert!(
        largest.len() <= MAX_BATCH_BODY_BYTES,
        "{} bytes do not fit in {MAX_BATCH_BODY_BYTES}",
        largest.len()
    );
    // Padded with whitespace to the limit exactly.
    let exact = largest.clone() + &" ".repeat(MAX_BATCH_BODY_BYTES - largest.len());
    let response = post_raw(&app, "/v1/reserve/batch", exact.clone()).await;
    assert_eq!(response.status(), 200);
    let decisions: Value = response.json().await.unwrap();
    let decisions = decisions["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), MAX_BATCH_ITEMS);
    assert_eq!(
        decisions[499]["ref"],
        format!("{:0>width$}", 499, width = MAX_REF_LEN)
    );
    assert!(decisions.iter().all(|d| d["outcome"] == "granted"));

    let response = post_raw(&app, "/v1/reserve/batch", exact + " ").await;
    assert_eq!(response.status(), 413);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );

    // One item too many is refused for its count, not its size.
    let plain: Vec<Value> = (0..=MAX_BATCH_ITEMS)
        .map(|i| {
            json!({"ref": format!("{i:0>width$}", width = MAX_REF_LEN), "flow": flow,
                   "count": MAX_COUNT, "deadline": "2099-12-31T23:59:59.999999999+05:30"})
        })
        .collect();
    let response = post_raw(
        &app,
        "/v1/reserve/batch",
        json!({ "items": plain }).to_string(),
    )
    .await;
    assert_eq!(response.status(), 422);

    // Every other route keeps the small limit.
    let padded = format!(
        "{:<width$}",
        json!({"flow": flow}).to_string(),
        width = MAX_BODY_BYTES + 1
    );
    assert_eq!(post_raw(&app, "/v1/reserve", padded).await.status(), 413);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_batch_on_a_quota_with_headroom_is_shared_out_of_one_take_within_each_flows_share(
    pool: PgPool,
) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 10, "sync", "enforce").await;
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    set_limits(&pool, "ppf", "priority3_share = 50").await;
    sqlx::query("UPDATE flow SET priority = CASE name WHEN 'sync' THEN 3 ELSE 1 END")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    // Priority 1 goes first and takes 4; priority 3 may then reach 5 of 10:
    // one more; the rest of the window stays for priority 1.
    let items: Vec<Value> = (0..4)
        .map(|i| json!({"flow": "sync", "ref": format!("s-{i}")}))
        .chain((0..4).map(|i| json!({"flow": "invoice", "ref": format!("i-{i}")})))
        .collect();
    let decisions = batch(&app, json!(items)).await;
    let granted = |prefix: &str| {
        decisions
            .iter()
            .filter(|d| d["ref"].as_str().unwrap().starts_with(prefix))
            .filter(|d| d["outcome"] == "granted")
            .count()
    };
    assert_eq!((granted("i-"), granted("s-")), (4, 1), "{decisions:?}");
    let refused = decisions
        .iter()
        .find(|d| d["outcome"] == "deferred")
        .unwrap();
    assert_eq!(refused["limit"], "budget");
    assert_eq!(
        current_count(&pool, "ppf").await,
        5,
        "slots no item could use went back"
    );
}

/// A batch's RateLimit fields: one policy per quota its items drew on, in
/// the order first drawn on, each with what its tightest item left (a
/// deferred item: nothing, until its own retry).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn ratelimit_fields_name_each_quota_drawn_on_with_its_tightest_item(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 3, "invoice", "enforce").await;
    create_flow(&pool, "crm", 10, "sync", "enforce").await;
    create_flow(&pool, "mail", 5, "ack", "count").await;
    create_flow(&pool, "news", 5, "report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    let items = json!({"items": [
        {"flow": "report", "ref": "r1"},
        {"flow": "sync", "ref": "s1", "count": 2},
        {"flow": "invoice", "ref": "i1"},
        {"flow": "ack", "ref": "a1"},
        {"flow": "invoice", "ref": "i2"},
        {"flow": "sync", "ref": "s2"},
        {"flow": "invoice", "ref": "i3"},
        {"flow": "invoice", "ref": "i4"},
        {"flow": "report", "ref": "r2"},
        {"flow": "who-knows", "ref": "u1"},
    ]});
    let response = app.post_batch(items).await;
    assert_eq!(response.status(), 200);
    let field = |name: &str| header_once(&response, name);
    let (policy, ratelimit) = (field("ratelimit-policy"), field("ratelimit"));
    assert_eq!(field("retry-after"), None, "each item has its own");
    let decisions: Value = response.json().await.unwrap();
    let decisions = decisions["decisions"].as_array().unwrap();
    let deferred = &decisions[7];
    assert_eq!(deferred["outcome"], "deferred", "{deferred}");
    let retry = deferred["retry_after_seconds"].as_i64().unwrap();
    assert!((2900..=3000).contains(&retry), "{retry}");

    assert_eq!(
        policy.as_deref(),
        Some("\"news\";q=5;w=3600, \"crm\";q=10;w=3600, \"ppf\";q=3;w=3600, \"mail\";q=5;w=3600"),
        "an unknown flow draws on no policy"
    );
    let ratelimit = ratelimit.expect("a RateLimit field");
    // Not mail's: counted after the fact, nothing read of it.
    let fields: Vec<&str> = ratelimit.split(", ").collect();
    let [news, crm, ppf] = fields[..] else {
        panic!("three quotas: {ratelimit}");
    };
    let t = |field: &str, prefix: &str| -> i64 {
        let t = field
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{prefix}: {field}"));
        t.parse().unwrap()
    };
    // ~50 minutes until the window ends.
    let news_t = t(news, "\"news\";r=3;t=");
    assert!((2900..=3000).contains(&news_t), "2 of 5 observed: {news_t}");
    let crm_t = t(crm, "\"crm\";r=7;t=");
    assert!((2900..=3000).contains(&crm_t), "3 of 10 taken: {crm_t}");
    assert_eq!(t(ppf, "\"ppf\";r=0;t="), retry, "the deferred item's");
}
