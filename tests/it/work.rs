//! The pending-work registry: enqueue, claim (global rationing), leases.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use quota_arbiter::domain::decision::{Limit, Outcome};
use quota_arbiter::store::WorkItem;
use quota_arbiter::work_registry::{Claim, ClaimOutcome};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, db_now, eventually, pin_clock, set_limits, TestApp,
};

async fn post(app: &TestApp, path: &str, body: Value) -> reqwest::Response {
    app.post(path).json(&body).send().await.unwrap()
}

async fn claim(app: &TestApp, body: Value) -> Claim {
    let response = post(app, "/v1/work/claim", body).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn enqueue(app: &TestApp, body: Value) -> (u16, WorkItem) {
    let response = post(app, "/v1/work", body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Every column of every item, in id order: what "unchanged" means.
async fn queue_dump(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT row_to_json(w)::text FROM work_item w ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn enqueue_is_idempotent_by_ref_and_validated(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    sqlx::query("UPDATE flow SET priority = 1 WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    let body = json!({"flow": "invoice", "ref": "inv-1", "payload": {"invoice": 1}});
    let (status, first) = enqueue(&app, body.clone()).await;
    assert_eq!(status, 201);
    assert_eq!(
        (first.state.as_str(), first.priority),
        ("pending", 1),
        "the flow's priority"
    );
    let (status, again) = enqueue(&app, body).await;
    assert_eq!((status, again.id), (200, first.id), "same ref, same item");
    let big = "x".repeat(9000);
    // A ref alone names the work: no payload is `null`.
    let (status, bare) = enqueue(&app, json!({"flow": "invoice", "ref": "inv-2"})).await;
    assert_eq!((status, &bare.payload), (201, &Value::Null));
    for bad in [
        json!({"flow": "", "payload": {}}),
        json!({"flow": "invoice", "payload": {}, "priority": 0}),
        json!({"flow": "invoice", "payload": {"blob": big}}),
        json!({"flow": "invoice", "payload": {}, "extra": true}),
    ] {
        assert_eq!(post(&app, "/v1/work", bad).await.status(), 422);
    }
    assert_eq!(
        claim(&app, json!({"worker": "w-1", "flows": ["other"]}))
            .await
            .outcome,
        ClaimOutcome::Empty
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_claimers_ration_by_deadline_without_double_claims(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "qa", 100, "fa", "enforce").await;
    create_flow(&pool, "qb", 300, "fb", "enforce").await;
    // 500 items per flow, deadlines scattered over the next days (outside the
    // bypass horizon), every tenth without a deadline, priorities 1 to 3.
    sqlx::query(
        "INSERT INTO work_item (flow, deadline, priority, payload)
         SELECT CASE WHEN i % 2 = 0 THEN 'fa' ELSE 'fb' END,
                CASE WHEN i % 10 = 3 THEN NULL
                     ELSE arbiter_now() + make_interval(mins => 60 + (i * 7919) % 600) END,
                1 + i % 3, jsonb_build_object('i', i)
         FROM generate_series(1, 1000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let claimers: Vec<_> = (0..8)
        .map(|w| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let claim =
                        claim(&app, json!({"worker": format!("w-{w}"), "max": 1 + w % 4})).await;
                    if claim.outcome != ClaimOutcome::Claimed {
                        return (got, claim);
                    }
                    got.extend(claim.items);
                }
            })
        })
        .collect();
    let mut granted = Vec::new();
    for claimer in claimers {
        let (got, last) = claimer.await.unwrap();
        assert_eq!(
            last.outcome,
            ClaimOutcome::Deferred,
            "work is left, none grantable"
        );
        assert!(last.retry_at.is_some() && last.retry_after_seconds.is_some());
        granted.extend(got);
    }
    let ids: HashSet<i64> = granted.iter().map(|c| c.item.id).collect();
    assert_eq!(ids.len(), granted.len(), "no item claimed twice");
    let mut by_flow: HashMap<String, Vec<i64>> = HashMap::new();
    for c in &granted {
        assert_eq!(
            c.decision.outcome,
            quota_arbiter::domain::decision::Outcome::Granted
        );
        by_flow
            .entry(c.item.flow.clone())
            .or_default()
            .push(c.item.id);
    }
    assert_eq!(current_count(&pool, "qa").await, 100, "qa full, not over");
    assert_eq!(
        current_count(&pool, "qb").await,
        300,
        "qa full did not starve qb"
    );
    for (flow, ceiling) in [("fa", 100), ("fb", 300)] {
        let ideal: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM work_item WHERE flow = $1
             ORDER BY deadline ASC NULLS LAST, priority, id LIMIT $2",
        )
        .bind(flow)
        .bind(ceiling)
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut got = by_flow.remove(flow).unwrap_or_default();
        got.sort_unstable();
        let mut ideal_sorted = ideal.clone();
        ideal_sorted.sort_unstable();
        assert_eq!(got, ideal_sorted, "{flow}: the earliest deadlines, exactly");
    }
    let claimed: i64 = sqlx::query_scalar("SELECT count(*) FROM work_item WHERE state = 'claimed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(claimed, 400);
}

/// Takes (deciding statements) a replica ran so far, by its latency histogram.
async fn deciding_statements(app: &TestApp) -> f64 {
    let text = crate::helpers::metrics_text(&app.client, &app.base).await;
    text.lines()
        .find_map(|line| line.strip_prefix("quota_arbiter_reserve_duration_seconds_count "))
        .expect("the deciding statements' histogram")
        .trim()
        .parse()
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_claims_on_one_quota_share_a_take_and_stay_exact(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "q", 50, "f", "enforce").await;
    sqlx::query(
        "INSERT INTO work_item (flow, deadline, priority, payload)
         SELECT 'f', arbiter_now() + make_interval(hours => 2 + i), 1, '{}'
         FROM generate_series(1, 200) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let before = deciding_statements(&app).await;
    // 64 claims at once, up to 2 items each: 128 wanted, 50 slots.
    let claims: Vec<_> = (0..64)
        .map(|w| {
            let app = app.clone();
            tokio::spawn(
                async move { claim(&app, json!({"worker": format!("w-{w}"), "max": 2})).await },
            )
        })
        .collect();
    let mut leased = Vec::new();
    for claim in claims {
        let claim = claim.await.unwrap();
        match claim.outcome {
            ClaimOutcome::Claimed => leased.extend(claim.items.into_iter().map(|c| c.item.id)),
            outcome => assert_eq!(outcome, ClaimOutcome::Deferred),
        }
    }
    let distinct: HashSet<i64> = leased.iter().copied().collect();
    assert_eq!(distinct.len(), leased.len(), "no item leased twice");
    assert_eq!(leased.len(), 50, "exactly the ceiling leased");
    assert_eq!(
        current_count(&pool, "q").await,
        50,
        "every slot used, none given twice"
    );
    let statements = deciding_statements(&app).await - before;
    assert!(
        statements < 64.0,
        "{statements} takes for 64 concurrent claims: none shared a take"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_dead_workers_item_returns_after_its_lease_and_its_slot_stays_spent(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let (_, item) = enqueue(&app, json!({"flow": "invoice", "payload": {"n": 1}})).await;
    let first = claim(&app, json!({"worker": "w-1"})).await;
    assert_eq!(first.items[0].item.id, item.id);
    assert_eq!(first.items[0].item.claimed_by.as_deref(), Some("w-1"));
    // w-1 dies. Before its lease runs out nobody else gets the item.
    assert_eq!(
        claim(&app, json!({"worker": "w-2"})).await.outcome,
        ClaimOutcome::Empty
    );
    sqlx::query("UPDATE work_item SET lease_until = arbiter_now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let second = claim(&app, json!({"worker": "w-2"})).await;
    assert_eq!(second.outcome, ClaimOutcome::Claimed);
    let again = &second.items[0].item;
    assert_eq!((again.id, again.attempts), (item.id, 2));
    assert_eq!(again.claimed_by.as_deref(), Some("w-2"));
    assert_eq!(
        current_count(&pool, "ppf").await,
        2,
        "the burned slot is still counted"
    );
    // w-1 comes back too late: the claim is w-2's.
    let late = post(
        &app,
        &format!("/v1/work/{}/done", item.id),
        json!({"worker": "w-1"}),
    )
    .await;
    assert_eq!(late.status(), 409);
    let done = post(
        &app,
        &format!("/v1/work/{}/done", item.id),
        json!({"worker": "w-2"}),
    )
    .await;
    assert_eq!(done.status(), 200);
    let done: WorkItem = done.json().await.unwrap();
    assert_eq!(done.state, "done");
    assert!(done.done_at.is_some() && done.lease_until.is_none());
    assert_eq!(
        claim(&app, json!({"worker": "w-3"})).await.outcome,
        ClaimOutcome::Empty
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn lapsed_leases_of_due_and_unthrottled_items_return_in_rationing_order(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    // A flow the arbiter does not know is never throttled; a deadline inside
    // the bypass horizon is due.
    let (_, due) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    sqlx::query(
        "UPDATE work_item SET deadline = arbiter_now() + interval '1 minute' WHERE id = $1",
    )
    .bind(due.id)
    .execute(&pool)
    .await
    .unwrap();
    let (_, free) = enqueue(&app, json!({"flow": "webhook", "payload": {}})).await;
    let (_, later) = enqueue(&app, json!({"flow": "webhook", "payload": {}})).await;
    let first = claim(&app, json!({"worker": "w-1", "max": 2})).await;
    let ids: Vec<i64> = first.items.iter().map(|c| c.item.id).collect();
    assert_eq!(ids, vec![due.id, free.id]);
    // w-1 dies; its leases run out while `later` still waits, pending.
    sqlx::query("UPDATE work_item SET lease_until = arbiter_now() - interval '1 second' WHERE state = 'claimed'")
        .execute(&pool)
        .await
        .unwrap();
    let second = claim(&app, json!({"worker": "w-2", "max": 3})).await;
    let again: Vec<(i64, Outcome)> = second
        .items
        .iter()
        .map(|c| (c.item.id, c.decision.outcome))
        .collect();
    assert_eq!(
        again,
        vec![
            (due.id, Outcome::Bypassed),
            (free.id, Outcome::Unthrottled),
            (later.id, Outcome::Unthrottled),
        ],
        "lapsed leases come back, each in its lane, before younger pending work"
    );
    assert!(second.items.iter().all(|c| c.item.attempts >= 1));
}

/// Each lane (enforced, observed, never throttled) hands its most urgent
/// items over in rationing order; the claim merges the lanes in the same
/// order: an earlier deadline first whatever the lane or the arrival, then
/// priority, then arrival.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_takes_the_most_urgent_items_across_lanes(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 100, "digest", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    let now = db_now(&pool).await;
    // Every deadline is hours away: none is due, each lane decides its own.
    let at = |hours: i64| (now + Duration::hours(hours)).to_rfc3339();
    let mut ids = HashMap::new();
    for (name, flow, deadline) in [
        ("unthrottled, 4 h", "webhook", Some(at(4))),
        ("observed, none", "digest", None),
        ("enforced, 3 h", "invoice", Some(at(3))),
        ("observed, 2 h", "digest", Some(at(2))),
        ("unthrottled, none", "webhook", None),
    ] {
        let (_, item) = enqueue(
            &app,
            json!({"flow": flow, "deadline": deadline, "payload": {}}),
        )
        .await;
        ids.insert(item.id, name);
    }
    let urgent_first = |max: i64| {
        let app = &app;
        let ids = &ids;
        async move {
            let claimed = claim(app, json!({"worker": "w-1", "max": max})).await;
            claimed
                .items
                .iter()
                .map(|c| ids[&c.item.id])
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        urgent_first(3).await,
        ["observed, 2 h", "enforced, 3 h", "unthrottled, 4 h"]
    );
    assert_eq!(
        urgent_first(5).await,
        ["observed, none", "unthrottled, none"],
        "without deadlines, the same priority: first come first served"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_released_item_is_pending_again_and_keeps_its_slot_spent(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 5, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let (_, item) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    claim(&app, json!({"worker": "w-1"})).await;
    let path = format!("/v1/work/{}/release", item.id);
    assert_eq!(
        post(&app, &path, json!({"worker": "w-9"})).await.status(),
        409
    );
    let released: WorkItem = post(&app, &path, json!({"worker": "w-1", "retry_in": "0s"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(released.state, "pending");
    assert_eq!(
        current_count(&pool, "ppf").await,
        1,
        "over-count, never under-count"
    );
    let again = claim(&app, json!({"worker": "w-2"})).await;
    assert_eq!(again.items[0].item.id, item.id);
    assert_eq!(
        post(&app, "/v1/work/999999/done", json!({"worker": "w-2"}))
            .await
            .status(),
        404
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_deferred_claim_leaves_the_queue_byte_for_byte_unchanged(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 2, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let now = db_now(&pool).await;
    for i in 0..5 {
        let deadline = now + Duration::hours(2 + i);
        enqueue(
            &app,
            json!({"flow": "invoice", "deadline": deadline, "payload": {"i": i}}),
        )
        .await;
    }
    let granted = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    assert_eq!(granted.items.len(), 2, "the ceiling");
    let before = queue_dump(&pool).await;
    let response = post(&app, "/v1/work/claim", json!({"worker": "w-2", "max": 3})).await;
    let retry_after: i64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let deferred: Claim = response.json().await.unwrap();
    assert_eq!(deferred.outcome, ClaimOutcome::Deferred);
    assert!(deferred.items.is_empty());
    let window_end: DateTime<Utc> = sqlx::query_scalar("SELECT window_end_of(arbiter_now())")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(deferred.retry_at, Some(window_end), "the next window");
    assert!((2900..=3000).contains(&retry_after), "{retry_after}");
    assert_eq!(queue_dump(&pool).await, before, "nothing written");
    assert_eq!(current_count(&pool, "ppf").await, 2);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn due_items_are_claimed_as_bypassed_from_a_closed_quota(pool: PgPool) {
    create_flow(&pool, "closed", 0, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 1, "report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    let now = db_now(&pool).await;
    enqueue(&app, json!({"flow": "invoice", "payload": {}, "ref": "later", "deadline": now + Duration::hours(3)})).await;
    enqueue(&app, json!({"flow": "invoice", "payload": {}, "ref": "soon", "deadline": now + Duration::minutes(5)})).await;
    enqueue(
        &app,
        json!({"flow": "mystery", "payload": {}, "ref": "unknown"}),
    )
    .await;
    enqueue(&app, json!({"flow": "report", "payload": {}, "ref": "r1"})).await;
    enqueue(&app, json!({"flow": "report", "payload": {}, "ref": "r2"})).await;
    let got = claim(&app, json!({"worker": "w-1", "max": 10})).await;
    let summary: Vec<(Option<String>, String, bool)> = got
        .items
        .iter()
        .map(|c| {
            let outcome = c.decision.outcome.as_str().to_string();
            (c.item.reference.clone(), outcome, c.decision.would_defer)
        })
        .collect();
    let expected = [
        ("soon", "bypassed", false),
        ("unknown", "unthrottled", false),
        ("r1", "granted", false),
        ("r2", "granted", true),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(r, o, w)| (Some(r.to_string()), o.to_string(), *w))
        .collect();
    let mut summary_sorted = summary.clone();
    summary_sorted.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(summary_sorted, expected_sorted, "{summary:?}");
    assert_eq!(summary[0].1, "bypassed", "the most urgent first");
    assert_eq!(
        current_count(&pool, "closed").await,
        0,
        "no reservation for bypass (counted after the fact)"
    );
    let left = claim(&app, json!({"worker": "w-1"})).await;
    assert_eq!(
        left.outcome,
        ClaimOutcome::Deferred,
        "'later' waits for a ceiling"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_closed_quota_does_not_block_another_and_unused_slots_are_given_back(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "a-closed", 0, "fa", "enforce").await;
    create_flow(&pool, "b-open", 5, "fb", "enforce").await;
    create_flow(&pool, "c-idle", 5, "fc", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for (flow, n) in [("fa", 2), ("fb", 3)] {
        for _ in 0..n {
            enqueue(&app, json!({"flow": flow, "payload": {}})).await;
        }
    }
    let got = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    let flows: Vec<&str> = got.items.iter().map(|c| c.item.flow.as_str()).collect();
    assert_eq!(flows, ["fb", "fb", "fb"]);
    assert_eq!(
        current_count(&pool, "b-open").await,
        3,
        "2 of 5 taken, given back"
    );
    assert_eq!(current_count(&pool, "a-closed").await, 0);
    assert_eq!(current_count(&pool, "c-idle").await, 0, "no work, no take");
    let left = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    assert_eq!(left.outcome, ClaimOutcome::Deferred);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_lane_that_ran_dry_gives_back_its_take_and_is_looked_at_next_time(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "q", 10, "f", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "f", 2).await;
    let got = claim(&app, json!({"worker": "w-1", "max": 2})).await;
    assert_eq!(got.items.len(), 2);

    // Every slot taken was used: the next claim takes without looking first,
    // finds the queue empty and gives the slots back before it answers.
    let takes = deciding_statements(&app).await;
    let empty = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    assert_eq!(empty.outcome, ClaimOutcome::Empty);
    assert_eq!(current_count(&pool, "q").await, 2, "the take given back");
    assert_eq!(deciding_statements(&app).await, takes + 1.0);

    // Its queue ran dry: the next claim looks first, and takes nothing.
    let empty = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    assert_eq!(empty.outcome, ClaimOutcome::Empty);
    assert_eq!(deciding_statements(&app).await, takes + 1.0, "no take");

    enqueue_n(&app, "f", 1).await;
    let got = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    assert_eq!(got.items.len(), 1);
    assert_eq!(current_count(&pool, "q").await, 3);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_deferred_claim_without_deadlines_waits_for_the_next_window(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for i in 0..3 {
        enqueue(&app, json!({"flow": "invoice", "payload": {"i": i}})).await;
    }
    assert_eq!(
        claim(&app, json!({"worker": "w-1", "max": 3}))
            .await
            .items
            .len(),
        1
    );
    let deferred = claim(&app, json!({"worker": "w-2"})).await;
    assert_eq!(deferred.outcome, ClaimOutcome::Deferred);
    assert_eq!(deferred.limit, Some(Limit::Budget));
    let window_end: DateTime<Utc> = sqlx::query_scalar("SELECT window_end_of(arbiter_now())")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        deferred.retry_at,
        Some(window_end),
        "not now: nothing can be granted before"
    );
    assert!(deferred.retry_after_seconds.is_some_and(|s| s > 2900));
}

/// A claim that gets nothing: deferred, by which limit, and how long until
/// its `retry_at` by the database clock.
async fn deferred_claim(app: &TestApp, pool: &PgPool, body: Value) -> (Option<Limit>, Duration) {
    let deferred = claim(app, body).await;
    assert_eq!(deferred.outcome, ClaimOutcome::Deferred, "{deferred:?}");
    let wait = deferred.retry_at.unwrap() - db_now(pool).await;
    (deferred.limit, wait)
}

pub(crate) async fn enqueue_n(app: &TestApp, flow: &str, n: usize) {
    for i in 0..n {
        let (status, _) = enqueue(app, json!({"flow": flow, "payload": {"i": i}})).await;
        assert_eq!(status, 201);
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn claims_hold_concurrency_slots_and_done_frees_them(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 100, "sync", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 2").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "sync", 5).await;

    let first = claim(&app, json!({"worker": "w-1", "max": 5})).await;
    assert_eq!(first.items.len(), 2, "two in-flight places, two items");
    let leases: HashSet<i64> = first
        .items
        .iter()
        .map(|c| {
            c.decision
                .lease_id
                .expect("a granted claim holds a place lease")
        })
        .collect();
    assert_eq!(leases.len(), 2);
    assert!(first.items.iter().all(|c| c.decision.valid_until.is_some()));
    assert_eq!(
        current_count(&pool, "api").await,
        2,
        "no budget slot beyond the two"
    );

    let (limit, wait) = deferred_claim(&app, &pool, json!({"worker": "w-2", "max": 5})).await;
    assert_eq!(limit, Some(Limit::InFlight));
    assert!(
        wait <= Duration::seconds(31),
        "retry when the first place lease expires, not at the next window: {wait}"
    );

    let done = post(
        &app,
        &format!("/v1/work/{}/done", first.items[0].item.id),
        json!({"worker": "w-1"}),
    )
    .await;
    assert_eq!(done.status(), 200);
    let next = claim(&app, json!({"worker": "w-2", "max": 5})).await;
    assert_eq!(next.items.len(), 1, "done freed exactly one slot");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM quota_place WHERE quota = 'api' AND valid_until > arbiter_now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(held, 2);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_deferred_by_cadence_retries_when_the_tokens_are_back(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 100, "sync", "enforce").await;
    set_limits(&pool, "api", "rate = 0.5, burst = 1").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "sync", 3).await;

    let first = claim(&app, json!({"worker": "w-1", "max": 3})).await;
    assert_eq!(first.items.len(), 1, "a bucket of one token");
    let (limit, wait) = deferred_claim(&app, &pool, json!({"worker": "w-1", "max": 3})).await;
    assert_eq!(limit, Some(Limit::Cadence));
    assert!(
        wait > Duration::zero() && wait <= Duration::seconds(2),
        "retry when the next token is there (2 s at 0.5/s), not at the next window: {wait}"
    );
    assert_eq!(
        current_count(&pool, "api").await,
        1,
        "the refusal spent no budget"
    );
}

/// A claim that gets nothing on two quotas retries when the first of their
/// limits lifts: the cadence's next token (2 s), not the full window's end,
/// whichever quota comes first in name order.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_deferred_on_two_quotas_retries_when_the_first_limit_lifts(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "a-budget", 1, "report", "enforce").await;
    create_flow(&pool, "b-paced", 100, "sync", "enforce").await;
    set_limits(&pool, "b-paced", "rate = 0.5, burst = 1, adaptive = false").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "report", 2).await;
    enqueue_n(&app, "sync", 2).await;

    let first = claim(&app, json!({"worker": "w-1", "max": 4})).await;
    assert_eq!(first.items.len(), 2, "one slot of each quota");
    let (limit, wait) = deferred_claim(&app, &pool, json!({"worker": "w-1", "max": 4})).await;
    assert_eq!(limit, Some(Limit::Cadence));
    assert!(
        wait > Duration::zero() && wait <= Duration::seconds(2),
        "retry at the next token, not at the window's end: {wait}"
    );
}

/// With the window full and an item waiting out a retry delay that ends
/// first, a claim that gets nothing retries when that delay ends (no limit
/// holds that item back till then).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_held_by_the_budget_retries_when_a_retry_delay_ends_first(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 2, "sync", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "sync", 3).await;
    let full = claim(&app, json!({"worker": "w-1", "max": 2})).await;
    assert_eq!(full.items.len(), 2, "the window is full");
    let delayed = full.items[0].item.id;
    let body = json!({"worker": "w-1", "retry_in": "10m"});
    assert_eq!(release(&app, delayed, body).await.status(), 200);

    let (limit, wait) = deferred_claim(&app, &pool, json!({"worker": "w-2", "max": 2})).await;
    assert_eq!(limit, None);
    assert!(
        wait > Duration::minutes(9) && wait <= Duration::minutes(10),
        "retry when the delay ends, not at the window's end (50 min): {wait}"
    );
}

/// Nothing claimable, one item waiting out a retry delay that ends past the
/// window: the claim retries when the delay ends, with no limit named (no
/// window or bucket holds anything back).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_with_only_delayed_items_retries_when_the_delay_ends(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100, "sync", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "sync", 1).await;
    let got = claim(&app, json!({"worker": "w-1"})).await;
    let body = json!({"worker": "w-1", "retry_in": "2h"});
    assert_eq!(
        release(&app, got.items[0].item.id, body).await.status(),
        200
    );

    let (limit, wait) = deferred_claim(&app, &pool, json!({"worker": "w-1"})).await;
    assert_eq!(limit, None);
    assert!(
        wait > Duration::minutes(119) && wait <= Duration::minutes(120),
        "retry when the delay ends: {wait}"
    );
}

/// A claimed item of a count-mode flow is never throttled (a ceiling of 1
/// holds none back), yet each is spent in its quota's window after the
/// fact and its decision names the quota, as `/v1/reserve` answers.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn claimed_items_of_a_counted_flow_are_unthrottled_and_counted(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1, "ack", "count").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "ack", 3).await;
    let got = claim(&app, json!({"worker": "w-1", "max": 3})).await;
    assert_eq!(got.items.len(), 3);
    for claimed in &got.items {
        assert_eq!(claimed.decision.outcome, Outcome::Unthrottled);
        assert_eq!(claimed.decision.quota.as_deref(), Some("ppf"));
    }
    let counted = eventually(StdDuration::from_secs(5), 3, || current_count(&pool, "ppf")).await;
    assert_eq!(counted, 3, "each claimed item counted after the fact");
}

/// Items in every state, done ones `hours_ago` in the past (database clock).
async fn seed_finished(pool: &PgPool, flow: &str, done_hours_ago: &[i32]) {
    for hours in done_hours_ago {
        sqlx::query(
            "INSERT INTO work_item (flow, priority, payload, state, outcome, done_at)
             VALUES ($1, 1, '{}', 'done', 'granted', arbiter_now() - make_interval(hours => $2))",
        )
        .bind(flow)
        .bind(hours)
        .execute(pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO work_item (flow, priority, payload, state, lease_until)
         VALUES ($1, 1, '{}', 'pending', NULL), ($1, 1, '{}', 'claimed', arbiter_now() - interval '9 days')",
    )
    .bind(flow)
    .execute(pool)
    .await
    .unwrap();
}

async fn states(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT state, count(*) FROM work_item GROUP BY state ORDER BY state")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn done_items_past_their_retention_are_pruned_in_batches_and_nothing_else(pool: PgPool) {
    seed_finished(&pool, "sync", &[200, 190, 170, 30, 1]).await;
    let store = quota_arbiter::store::Store::new(pool.clone());
    let week = std::time::Duration::from_secs(7 * 24 * 3600);

    assert_eq!(store.prune_done_work(week, 2).await.unwrap(), 2);
    assert_eq!(store.prune_done_work(week, 2).await.unwrap(), 1);
    assert_eq!(store.prune_done_work(week, 2).await.unwrap(), 0);
    assert_eq!(
        states(&pool).await,
        vec![
            ("claimed".to_string(), 1),
            ("done".to_string(), 2),
            ("pending".to_string(), 1)
        ],
        "recent done items, pending and claimed ones (even with a long-lapsed lease) stay"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_replica_prunes_done_items_past_the_configured_retention(pool: PgPool) {
    seed_finished(&pool, "sync", &[3, 2, 0]).await;
    let mut config = crate::helpers::test_config();
    config.work_retention = std::time::Duration::from_secs(3600);
    let _app = TestApp::spawn_with(pool.clone(), config).await;

    let done = crate::helpers::eventually(std::time::Duration::from_secs(10), 1, || async {
        states(&pool)
            .await
            .into_iter()
            .find(|(state, _)| state == "done")
            .map_or(0, |(_, n)| n)
    })
    .await;
    assert_eq!(done, 1, "only the item done within the hour is kept");
}

/// Items the operator's view counts as pending.
const PENDING_IN_VIEW: &str = "SELECT sum(items)::bigint FROM work_pending_by_flow";

/// A count an SQL query answers.
pub(crate) async fn count_of(pool: &PgPool, query: &str) -> i64 {
    sqlx::query_scalar(query).fetch_one(pool).await.unwrap()
}

async fn get_item(app: &TestApp, id: i64) -> WorkItem {
    let response = app.get(&format!("/v1/work/{id}")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn release(app: &TestApp, id: i64, body: Value) -> reqwest::Response {
    post(app, &format!("/v1/work/{id}/release"), body).await
}

/// Releases the item `id` held by w-1 with `body` and answers how far ahead
/// of the database clock it becomes claimable again, in seconds.
async fn released_for(app: &TestApp, pool: &PgPool, id: i64, body: Value) -> f64 {
    let response = release(app, id, body.clone()).await;
    assert_eq!(response.status(), 200, "release {body}");
    sqlx::query_scalar("SELECT extract(epoch FROM not_before - arbiter_now())::float8 FROM work_item WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `wait` (seconds) is a delay of `seconds` that began a moment ago.
fn assert_waits(wait: f64, seconds: f64, what: &str) {
    assert!(wait <= seconds && wait > seconds - 5.0, "{what}: {wait} s");
}

/// Ends every retry delay at once (time passing, as far as claims can
/// tell), then w-1 claims the one item.
async fn claim_when_due(app: &TestApp, pool: &PgPool) -> WorkItem {
    sqlx::query("UPDATE work_item SET not_before = NULL WHERE state = 'pending'")
        .execute(pool)
        .await
        .unwrap();
    let got = claim(app, json!({"worker": "w-1"})).await;
    assert_eq!(got.outcome, ClaimOutcome::Claimed);
    got.items[0].item.clone()
}

/// The worker loop of an emitter that always fails: claim, fail, release
/// with the default backoff, claim again at once, for 10 s. Every claim
/// spends a slot. The backoff makes the item claimable 5 s after its first
/// claim and 10 s after its second, so claims can only succeed at about 0 s
/// and 5 s (the third not before 15 s): at most 2 slots, where releasing
/// without a delay spends a slot on every turn of the loop.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_worker_whose_emission_always_fails_cannot_burn_the_quota(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100_000, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let (_, item) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    let started = std::time::Instant::now();
    let (mut turns, mut claimed) = (0_i64, 0_i64);
    while started.elapsed() < std::time::Duration::from_secs(10) && turns < 20_000 {
        turns += 1;
        let got = claim(&app, json!({"worker": "w-1", "flows": ["invoice"]})).await;
        if got.outcome == ClaimOutcome::Claimed {
            claimed += 1;
            let failed = release(&app, item.id, json!({"worker": "w-1"})).await;
            assert_eq!(failed.status(), 200);
        }
    }
    let spent = current_count(&pool, "ppf").await;
    assert_eq!(spent, claimed, "each claim spent one slot");
    assert!(
        (1..=2).contains(&spent),
        "{spent} slots spent in {turns} turns of the loop"
    );
    assert!(
        turns >= 50,
        "the loop kept trying ({turns} turns): without the backoff each would spend a slot"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_release_waits_by_the_default_backoff_or_the_delay_it_names(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let (_, item) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    let id = claim_when_due(&app, &pool).await.id;
    let w1 = json!({"worker": "w-1"});

    // First claim released: 5 s, by the database clock.
    let wait = released_for(&app, &pool, id, w1.clone()).await;
    assert_waits(wait, 5.0, "first claim");
    let waiting = get_item(&app, item.id).await;
    assert_eq!(waiting.state, "pending");
    assert_eq!(waiting.attempts, 1);
    // The claim is gone with the release: only the history stays.
    assert_eq!(
        (&waiting.claimed_by, waiting.claimed_at, waiting.lease_until),
        (&None, None, None)
    );
    assert_eq!(waiting.outcome.as_deref(), Some("granted"));
    let deferred = claim(&app, json!({"worker": "w-2"})).await;
    assert_eq!(deferred.outcome, ClaimOutcome::Deferred);
    assert_eq!(
        deferred.retry_at, waiting.not_before,
        "retry when it is claimable"
    );
    assert_eq!(
        deferred.limit, None,
        "no limit holds it back, its delay does"
    );
    assert!(deferred
        .retry_after_seconds
        .is_some_and(|s| (1..=5).contains(&s)));

    // The backoff doubles with every claim, up to an hour.
    claim_when_due(&app, &pool).await;
    let wait = released_for(&app, &pool, id, w1.clone()).await;
    assert_waits(wait, 10.0, "second claim");
    sqlx::query("UPDATE work_item SET attempts = 19")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(claim_when_due(&app, &pool).await.attempts, 20);
    let wait = released_for(&app, &pool, id, w1.clone()).await;
    assert_waits(wait, 3600.0, "capped");

    // A delay the worker names instead.
    let week = 7.0 * 24.0 * 3600.0;
    let now = db_now(&pool).await;
    for (body, seconds) in [
        (json!({"worker": "w-1", "retry_in": "90s"}), 90.0),
        (json!({"worker": "w-1", "retry_in": "1h 30m"}), 5400.0),
        (
            json!({"worker": "w-1", "retry_at": now + Duration::hours(2)}),
            7200.0,
        ),
        (json!({"worker": "w-1", "retry_in": "1000days"}), week),
        (
            json!({"worker": "w-1", "retry_at": now + Duration::days(30)}),
            week,
        ),
    ] {
        claim_when_due(&app, &pool).await;
        let wait = released_for(&app, &pool, id, body.clone()).await;
        assert_waits(wait, seconds, &body.to_string());
    }
    // A time already past means now.
    claim_when_due(&app, &pool).await;
    let past = json!({"worker": "w-1", "retry_at": now - Duration::hours(1)});
    assert_eq!(release(&app, id, past).await.status(), 200);
    let again = claim(&app, json!({"worker": "w-2"})).await;
    assert_eq!(again.outcome, ClaimOutcome::Claimed, "claimable at once");

    for bad in [
        json!({"worker": "w-2", "retry_in": "30s", "retry_at": now + Duration::hours(1)}),
        json!({"worker": "w-2", "retry_in": "soon"}),
        json!({"worker": "w-2", "retry_in": 30}),
        json!({"worker": "w-2", "retry_at": "2026-11-30T14:30:00"}),
        json!({"worker": "w-2", "retry_after": "30s"}),
    ] {
        assert_eq!(release(&app, id, bad.clone()).await.status(), 422, "{bad}");
    }
    assert_eq!(
        get_item(&app, id).await.state,
        "claimed",
        "nothing released"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_waiting_item_is_claimed_by_no_path_and_still_counts_as_pending(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 100, "report", "observe").await;
    create_flow(&pool, "ppf", 100, "ack", "count").await;
    let app = TestApp::spawn(pool.clone()).await;
    let soon = db_now(&pool).await + Duration::minutes(5);
    for (flow, reference) in [
        ("invoice", "enforced"),
        ("report", "observed"),
        ("ack", "counted"),
        ("mystery", "unknown"),
    ] {
        enqueue(&app, json!({"flow": flow, "ref": reference, "payload": {}})).await;
    }
    enqueue(
        &app,
        json!({"flow": "invoice", "ref": "due", "deadline": soon, "payload": {}}),
    )
    .await;
    let got = claim(&app, json!({"worker": "w-1", "max": 10})).await;
    let mut outcomes: Vec<String> = got
        .items
        .iter()
        .map(|c| c.decision.outcome.as_str().to_string())
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            "bypassed",
            "granted",
            "granted",
            "unthrottled",
            "unthrottled"
        ]
    );
    for c in &got.items {
        let body = json!({"worker": "w-1", "retry_in": "10m"});
        assert_eq!(release(&app, c.item.id, body).await.status(), 200);
    }

    let before = queue_dump(&pool).await;
    let (limit, wait) = deferred_claim(&app, &pool, json!({"worker": "w-2", "max": 10})).await;
    assert_eq!(limit, None);
    assert!(
        wait > Duration::minutes(9) && wait <= Duration::minutes(10),
        "{wait}"
    );
    assert_eq!(queue_dump(&pool).await, before, "nothing claimed");

    // Waiting is still pending, and the waiting have a view of their own.
    assert_eq!(count_of(&pool, PENDING_IN_VIEW).await, 5);
    let oldest = count_of(&pool, "SELECT count(*) FROM work_oldest_pending").await;
    assert_eq!(oldest, 4, "one per flow");
    let waiting: Vec<(String, i64)> =
        sqlx::query_as("SELECT flow, items FROM work_waiting_by_flow ORDER BY flow")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected = [("ack", 1), ("invoice", 2), ("mystery", 1), ("report", 1)];
    assert_eq!(waiting, expected.map(|(f, n)| (f.to_string(), n)));

    // The delay over, every path claims them again.
    sqlx::query("UPDATE work_item SET not_before = arbiter_now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let again = claim(&app, json!({"worker": "w-2", "max": 10})).await;
    assert_eq!(again.items.len(), 5);
    let waiting = count_of(&pool, "SELECT count(*) FROM work_waiting_by_flow").await;
    assert_eq!(waiting, 0);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_lapsed_lease_reads_pending_and_a_release_drops_the_claim(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "api", 100, "sync", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 1").await;
    let app = TestApp::spawn(pool.clone()).await;
    let job = json!({"flow": "sync", "ref": "job-1", "payload": {}});
    let (_, item) = enqueue(&app, job.clone()).await;
    let got = claim(&app, json!({"worker": "w-1"})).await;
    assert!(got.items[0].decision.lease_id.is_some());
    let held =
        "SELECT count(*) FROM quota_place WHERE quota = 'api' AND valid_until > arbiter_now()";
    assert_eq!(count_of(&pool, held).await, 1);

    let released: WorkItem = release(&app, item.id, json!({"worker": "w-1", "retry_in": "0s"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(released.state, "pending");
    assert_eq!(
        (
            &released.claimed_by,
            released.claimed_at,
            released.lease_until
        ),
        (&None, None, None),
        "nothing of the claim is left"
    );
    assert_eq!(
        count_of(&pool, held).await,
        0,
        "its in-flight place is free"
    );
    assert_eq!(get_item(&app, item.id).await, released);

    // w-2 claims it and dies: once its lease has run out the item reads
    // pending, like the views and the next claim see it.
    let got = claim(&app, json!({"worker": "w-2"})).await;
    assert_eq!(got.outcome, ClaimOutcome::Claimed, "the free slot");
    assert_eq!(get_item(&app, item.id).await.state, "claimed");
    sqlx::query("UPDATE work_item SET lease_until = arbiter_now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let lapsed = get_item(&app, item.id).await;
    assert_eq!(lapsed.state, "pending");
    assert_eq!(
        lapsed.claimed_by.as_deref(),
        Some("w-2"),
        "whose lease lapsed"
    );
    let (status, same_ref) = enqueue(&app, job).await;
    assert_eq!((status, same_ref.state.as_str()), (200, "pending"));
    assert_eq!(count_of(&pool, PENDING_IN_VIEW).await, 1);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn finishing_an_item_already_done_is_a_conflict_that_says_so(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    let (_, item) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    let (_, never_claimed) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    assert_eq!(
        claim(&app, json!({"worker": "w-1"})).await.items[0].item.id,
        item.id
    );
    let done = format!("/v1/work/{}/done", item.id);
    let first: WorkItem = post(&app, &done, json!({"worker": "w-1"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first.state, "done");
    let repeated = post(&app, &done, json!({"worker": "w-1"})).await;
    assert_eq!(repeated.status(), 200, "repeating it is harmless");
    assert_eq!(repeated.json::<WorkItem>().await.unwrap(), first);

    let conflicts = [
        (done.clone(), "w-2"),
        (format!("/v1/work/{}/release", item.id), "w-1"),
        (format!("/v1/work/{}/release", item.id), "w-2"),
    ];
    for (path, worker) in conflicts {
        let response = post(&app, &path, json!({"worker": worker})).await;
        assert_eq!(response.status(), 409, "{path} by {worker}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(
            problem["detail"],
            format!("work item {} is already done", item.id),
            "{path} by {worker}"
        );
    }
    assert_eq!(
        get_item(&app, item.id).await,
        first,
        "still done, unchanged"
    );

    let response = post(
        &app,
        &format!("/v1/work/{}/done", never_claimed.id),
        json!({"worker": "w-1"}),
    )
    .await;
    assert_eq!(response.status(), 409);
    let problem: Value = response.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("does not hold the claim"),
        "{problem}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claimed_observed_item_past_the_ceiling_says_which_limit_would_have_deferred_it(
    pool: PgPool,
) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1, "report", "observe").await;
    let app = TestApp::spawn(pool.clone()).await;
    enqueue_n(&app, "report", 2).await;
    let got = claim(&app, json!({"worker": "w-1", "max": 2})).await;
    let flags: Vec<(bool, Option<Limit>)> = got
        .items
        .iter()
        .map(|c| (c.decision.would_defer, c.decision.limit))
        .collect();
    assert_eq!(flags, [(false, None), (true, Some(Limit::Budget))]);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn times_the_store_cannot_hold_are_refused_not_an_outage(pool: PgPool) {
    create_flow(&pool, "ppf", 100, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;
    for deadline in ["-5000-01-01T00:00:00Z", "+200000-01-01T00:00:00Z"] {
        let body = json!({"flow": "invoice", "payload": {}, "deadline": deadline});
        assert_eq!(
            post(&app, "/v1/work", body).await.status(),
            422,
            "{deadline}"
        );
    }
    let (_, item) = enqueue(&app, json!({"flow": "invoice", "payload": {}})).await;
    claim(&app, json!({"worker": "w-1"})).await;
    for retry_at in ["-5000-01-01T00:00:00Z", "+200000-01-01T00:00:00Z"] {
        let body = json!({"worker": "w-1", "retry_at": retry_at});
        assert_eq!(
            release(&app, item.id, body).await.status(),
            422,
            "{retry_at}"
        );
    }
    assert_eq!(get_item(&app, item.id).await.state, "claimed");
}
