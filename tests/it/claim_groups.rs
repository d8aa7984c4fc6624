//! Concurrent claims of the same flows share one claim: one look, one take
//! per quota and one lease transaction for the group, its items falling to
//! the group's claims first come first served.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use quota_arbiter::store::claim::{ClaimGroup, Claimant, MeasuredLanes};
use quota_arbiter::store::Store;
use quota_arbiter::work_registry::{Claim, ClaimOutcome};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{
    create_flow, current_count, eventually, lock_window, metrics_text, pin_clock, pool_of, TestApp,
};
use crate::metrics::sample;
use crate::work::count_of;

async fn post_claim(app: &TestApp, body: Value) -> reqwest::Response {
    app.post("/v1/work/claim").json(&body).send().await.unwrap()
}

async fn insert_items(pool: &PgPool, flow: &str, n: i32) {
    sqlx::query(
        "INSERT INTO work_item (flow, deadline, priority, payload)
         SELECT $1, arbiter_now() + make_interval(hours => 2 + i), 1, '{}'
         FROM generate_series(1, $2) AS i",
    )
    .bind(flow)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_claims_of_the_same_flows_share_a_lease_transaction(pool: PgPool) {
    create_flow(&pool, "q", 1_000_000, "f", "enforce").await;
    insert_items(&pool, "f", 64).await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let claims: Vec<_> = (0..64)
        .map(|w| {
            let app = app.clone();
            tokio::spawn(async move {
                let worker = format!("w-{w}");
                let body = json!({"worker": worker, "flows": ["f"], "max": 1});
                let response = post_claim(&app, body).await;
                assert_eq!(response.status(), 200);
                (worker, response.json::<Claim>().await.unwrap())
            })
        })
        .collect();
    let mut leased = HashSet::new();
    for claim in claims {
        let (worker, claim) = claim.await.unwrap();
        assert_eq!(
            claim.outcome,
            ClaimOutcome::Claimed,
            "64 items for 64 claims"
        );
        assert_eq!(claim.items.len(), 1);
        let item = &claim.items[0].item;
        assert_eq!(item.claimed_by.as_deref(), Some(worker.as_str()));
        assert!(leased.insert(item.id), "item {} leased twice", item.id);
    }
    // Items leased by one transaction share its timestamp (arbiter_now()).
    let (leases, transactions): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT claimed_at) FROM work_item WHERE state = 'claimed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(leases, 64);
    assert!(
        transactions < 64,
        "{transactions} lease transactions for 64 concurrent claims: none was shared"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_groups_items_fall_to_its_claims_first_come_first_served_each_up_to_its_max(
    pool: PgPool,
) {
    // No flow of that name: never throttled, so the transaction alone decides.
    insert_items(&pool, "loose", 4).await;
    let claimants = [("a", 2, 30.0), ("b", 1, 60.0), ("c", 3, 90.0)].map(|(w, max, s)| Claimant {
        worker: w.to_string(),
        max,
        lease_seconds: s,
    });
    let group = ClaimGroup {
        claimants: &claimants,
        worker_flows: None,
        horizon_seconds: 900.0,
    };
    let store = Store::new(pool.clone());
    let begun = store.begin_claim(group).await.unwrap();
    let locked = store
        .lock_claim(begun, &[], &[], MeasuredLanes::default())
        .await
        .unwrap();
    let leases = store.lease_locked(locked, &HashMap::new()).await.unwrap();
    let by_claimant: Vec<Vec<i64>> = leases
        .items
        .iter()
        .map(|items| items.iter().map(|(item, _)| item.id).collect())
        .collect();
    let urgent: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM work_item ORDER BY deadline, priority, id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        by_claimant,
        vec![urgent[..2].to_vec(), vec![urgent[2]], vec![urgent[3]]],
        "the most urgent first, to the first claims, each up to its max"
    );
    for (claimant, items) in claimants.iter().zip(&leases.items) {
        for (item, _) in items {
            assert_eq!(item.claimed_by.as_deref(), Some(claimant.worker.as_str()));
            let (claimed_at, until): (DateTime<Utc>, DateTime<Utc>) =
                (item.claimed_at.unwrap(), item.lease_until.unwrap());
            let lease = (until - claimed_at).num_milliseconds() as f64 / 1e3;
            assert_eq!(
                lease, claimant.lease_seconds,
                "{}'s own lease",
                claimant.worker
            );
        }
    }
}

/// A claim that stops waiting while its group is still leasing: the items
/// leased for it are pending again at once, not held until their lease runs
/// out by a worker that was told 503.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn items_leased_for_a_claim_that_stopped_waiting_are_pending_again(pool: PgPool) {
    create_flow(&pool, "q", 1_000, "f", "enforce").await;
    insert_items(&pool, "f", 3).await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    let first = post_claim(&app, json!({"worker": "w-0", "flows": ["f"]})).await;
    assert_eq!(first.status(), 200, "the window row exists from here on");

    // Group 1 (claim a) waits on the window row until its budget runs out;
    // claim b joins meanwhile and is group 2, which starts when group 1 gives
    // up and waits on the row too. Once b has stopped waiting (503), the row
    // is let go: group 2 takes and leases for b, well within its own budget.
    let held = lock_window(&pool, "q").await;
    let claim = |worker: &'static str| {
        let app = app.clone();
        tokio::spawn(async move {
            let body = json!({"worker": worker, "flows": ["f"]});
            post_claim(&app, body).await.status().as_u16()
        })
    };
    let a = claim("w-a");
    let waiting = eventually(Duration::from_secs(5), 1, || {
        count_of(
            &pool,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
    })
    .await;
    assert_eq!(waiting, 1, "group 1's take waits on the window row");
    let b = claim("w-b");
    assert_eq!(b.await.unwrap(), 503, "b stopped waiting for group 2");
    held.rollback().await.unwrap();
    assert_eq!(
        a.await.unwrap(),
        503,
        "group 1 got no row within its budget"
    );

    // Group 2 leases once the row is free: b's item has had a claim.
    let count = |query: &'static str| count_of(&pool, query);
    let tried = eventually(Duration::from_secs(5), 2, || {
        count("SELECT count(*) FROM work_item WHERE attempts > 0")
    })
    .await;
    assert_eq!(
        tried, 2,
        "group 2 leased an item for b after b stopped waiting"
    );
    let claimed = eventually(Duration::from_secs(5), 1, || {
        count("SELECT count(*) FROM work_item WHERE state = 'claimed'")
    })
    .await;
    assert_eq!(claimed, 1, "only the first claim's item is leased");
    let stray =
        count("SELECT count(*) FROM work_item WHERE claimed_by = 'w-b' AND state = 'claimed'")
            .await;
    assert_eq!(stray, 0);
}

/// One claim per flow of `flows`, all at once, each worker named after its
/// flow and leasing up to `max`: each answer's status and body.
async fn claim_each_flow_at_once(
    app: &Arc<TestApp>,
    flows: Vec<String>,
    max: i64,
) -> Vec<(u16, Value)> {
    let claims: Vec<_> = flows
        .into_iter()
        .map(|flow| {
            let app = app.clone();
            tokio::spawn(async move {
                let body = json!({"worker": flow, "flows": [flow], "max": max});
                let response = post_claim(&app, body).await;
                (
                    response.status().as_u16(),
                    response.json::<Value>().await.unwrap(),
                )
            })
        })
        .collect();
    let mut answers = Vec::new();
    for claim in claims {
        answers.push(claim.await.unwrap());
    }
    answers
}

/// Claims of different flows on one enforced quota ask for its slots
/// together (one take, shared out up to each claim's max): however they
/// group, every leased item is counted in the window, and no more are leased
/// than its ceiling. Rounds of concurrent claims wanting more than the
/// ceiling, so that some group's take falls short of what it asked.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_claims_of_different_flows_never_lease_past_the_ceiling(pool: PgPool) {
    const ROUNDS: usize = 6;
    const CLAIMS: usize = 6;
    const CEILING: i64 = 10;
    // A pool of 16 (the test pool has 5): each claim group holds a
    // connection for its transaction while its take waits for another.
    let pool = pin_clock(&pool, 10).await;
    let flows = |round: usize| (0..CLAIMS).map(move |c| format!("f{round}-{c}"));
    for round in 0..ROUNDS {
        for flow in flows(round) {
            create_flow(&pool, &format!("q{round}"), CEILING, &flow, "enforce").await;
            insert_items(&pool, &flow, 4).await;
        }
    }
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    for round in 0..ROUNDS {
        let mut leased = 0;
        for (status, answer) in claim_each_flow_at_once(&app, flows(round).collect(), 4).await {
            assert_eq!(status, 200, "{answer}");
            leased += answer["items"].as_array().expect("items").len() as i64;
        }
        let counted = current_count(&pool, &format!("q{round}")).await;
        assert_eq!(
            leased, counted,
            "round {round}: every leased item counted, no more"
        );
        assert!(
            leased <= CEILING,
            "round {round}: {leased} leased, ceiling {CEILING}"
        );
    }
}

/// More claims of different flows at once than the pool has connections
/// (16): each claim's transaction holds a connection while its take needs
/// another, so with a transaction open per connection no take could run
/// and every claim waited out its time limit (23 of 24 answered 503).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn more_concurrent_claims_of_different_flows_than_connections_are_all_answered(pool: PgPool) {
    const CLAIMS: usize = 24;
    let pool = pin_clock(&pool, 10).await;
    let flows: Vec<String> = (0..CLAIMS).map(|c| format!("f{c}")).collect();
    for flow in &flows {
        create_flow(&pool, "q", 1000, flow, "enforce").await;
        insert_items(&pool, flow, 2).await;
    }
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    for (status, answer) in claim_each_flow_at_once(&app, flows, 1).await {
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["outcome"], "claimed", "{answer}");
    }
    // Claims of different flows are groups of their own: each waited for
    // its turn, and says how long.
    let text = metrics_text(&app.client, &app.base).await;
    let waits = sample(&text, "quota_arbiter_claim_wait_seconds_count");
    assert_eq!(waits, Some("24"), "{text}");
}

/// With half the pool in claim transactions, the next group waits for its
/// turn until one of them ends, and its wait is measured from when it asked.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_group_waits_for_a_turn_while_half_the_pool_is_in_claims(pool: PgPool) {
    // Two connections: one claim transaction at a time.
    let two = pool_of(&pool, 2).await;
    let store = Store::new(two);
    let claimants = [Claimant {
        worker: "w".to_string(),
        max: 1,
        lease_seconds: 30.0,
    }];
    let group = ClaimGroup {
        claimants: &claimants,
        worker_flows: None,
        horizon_seconds: 900.0,
    };
    let first = store.begin_claim(group).await.unwrap();
    const HELD: Duration = Duration::from_millis(300);
    let (second, ()) = tokio::join!(store.begin_claim(group), async {
        tokio::time::sleep(HELD).await;
        drop(first); // rolled back: the turn is free
    });
    let waited = second.unwrap().waited;
    assert!(waited >= HELD, "waited {waited:?} for a turn held {HELD:?}");
}

/// A claim whose lease fails after its lane took its slots: every slot taken
/// goes back (an over-count only until the give-back runs); none stays
/// counted for items nobody leased. A trigger that refuses every update of a
/// work item makes the lease fail.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claim_whose_lease_fails_gives_back_every_slot_it_took(pool: PgPool) {
    create_flow(&pool, "q", 1000, "f", "enforce").await;
    insert_items(&pool, "f", 3).await;
    for statement in [
        "CREATE FUNCTION refuse_lease() RETURNS trigger LANGUAGE plpgsql
         AS $$ BEGIN RAISE EXCEPTION 'lease refused by the test'; END $$",
        "CREATE TRIGGER refuse_lease BEFORE UPDATE ON work_item
         FOR EACH ROW EXECUTE FUNCTION refuse_lease()",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let app = TestApp::spawn(pool.clone()).await;
    let body = json!({"worker": "w", "flows": ["f"], "max": 2});
    assert_eq!(post_claim(&app, body).await.status(), 500);
    // The row exists once the take ran; its count is back to 0 once the
    // slots went back.
    let window_count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count FROM quota_window WHERE quota = 'q'")
            .fetch_optional(&pool)
            .await
            .unwrap()
    };
    let counted = eventually(Duration::from_secs(5), Some(0), window_count).await;
    assert_eq!(counted, Some(0), "the two slots taken went back");
}
