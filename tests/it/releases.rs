//! Releases coalesced (issue 38, design.md §8): concurrent releases share a
//! statement that frees each place once and folds each flow's hold times
//! into its average as one release after the other would.

use std::sync::Arc;

use quota_arbiter::domain::catalog::QuotaRule;
use quota_arbiter::domain::decision::Outcome;
use quota_arbiter::domain::window::WindowRule;
use quota_arbiter::store::{LeaseRelease, LeaseScope, PacedAsks, ReleaseAsk, Store};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::{create_flow, set_limits, TestApp};

fn places(name: &str, max_in_flight: i32) -> QuotaRule {
    QuotaRule {
        name: name.into(),
        windows: vec![WindowRule::hour(1_000_000)],
        cadence: None,
        max_in_flight: Some(max_in_flight),
        priority2_share: None,
        priority3_share: None,
    }
}

/// `n` leases of quota `quota` for flow `flow`.
async fn leases(store: &Store, quota: &QuotaRule, flow: &str, n: usize) -> Vec<i64> {
    let (slots, flows) = (vec![1; n], vec![flow.to_string(); n]);
    let asks = PacedAsks {
        slots: &slots,
        flows: &flows,
        share: None,
        need_places: true,
    };
    let take = store.take_paced_group(quota, &asks).await.unwrap();
    assert_eq!(take.leases.len(), n);
    take.leases.iter().map(|l| l.lease.id).collect()
}

async fn average(pool: &PgPool, flow: &str) -> (f64, i64) {
    sqlx::query_as("SELECT avg_seconds, samples FROM flow_lease_duration WHERE flow = $1")
        .bind(flow)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn free_places(pool: &PgPool, quota: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM quota_place WHERE quota = $1 AND lease_id IS NULL")
        .bind(quota)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The same hold times released one by one for flow `one`, and in one
/// group for flow `group` (and then once more each, onto an average that
/// exists): the same averages and sample counts.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_group_of_releases_averages_as_one_release_after_another(pool: PgPool) {
    create_flow(&pool, "api", 1_000_000, "one", "enforce").await;
    create_flow(&pool, "api", 1_000_000, "group", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 20").await;
    let (store, quota) = (Store::new(pool.clone()), places("api", 20));
    let held = [0.5, 2.0, 1.0, 4.0, 0.25, 3.0];
    for round in 0..2 {
        let one = leases(&store, &quota, "one", held.len()).await;
        for (id, seconds) in one.iter().zip(held) {
            assert!(store
                .release_lease(*id, Some(seconds))
                .await
                .unwrap()
                .is_some());
        }
        let group = leases(&store, &quota, "group", held.len()).await;
        let asks: Vec<ReleaseAsk> = group
            .iter()
            .zip(held)
            .map(|(&lease_id, seconds)| ReleaseAsk {
                lease_id,
                held_seconds: Some(seconds),
                scope: LeaseScope::default(),
            })
            .collect();
        let released = store.release_leases(&asks).await.unwrap();
        assert!(released
            .iter()
            .all(|r| matches!(r, LeaseRelease::Released(_))));
        let (one, group) = (average(&pool, "one").await, average(&pool, "group").await);
        assert!(
            (one.0 - group.0).abs() < 1e-9,
            "round {round}: one by one {one:?}, as a group {group:?}"
        );
        assert_eq!(one.1, group.1, "round {round}: samples");
        if round == 0 {
            // The first sets it, each later one moves it a tenth of the way:
            // 0.5, 0.65, 0.685, 1.0165, 0.93985, 1.145865.
            assert!((one.0 - 1.145865).abs() < 1e-9, "{one:?}");
        }
    }
    assert_eq!(free_places(&pool, "api").await, 20);
}

/// A lease that expired and whose place was taken again frees nothing
/// when it is released: the new holder keeps its place.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_release_after_its_lease_expired_and_was_taken_again_frees_nothing(pool: PgPool) {
    create_flow(&pool, "api", 1_000_000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 1").await;
    let (store, quota) = (Store::new(pool.clone()), places("api", 1));
    let old = leases(&store, &quota, "invoice", 1).await[0];
    sqlx::query("UPDATE quota_place SET valid_until = arbiter_now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let new = leases(&store, &quota, "invoice", 1).await[0];
    assert_ne!(old, new);
    assert!(store.release_lease(old, None).await.unwrap().is_none());
    assert_eq!(
        free_places(&pool, "api").await,
        0,
        "the new holder keeps it"
    );
    assert!(store.release_lease(new, None).await.unwrap().is_some());
    assert_eq!(free_places(&pool, "api").await, 1);
}

/// 64 workers on 64 places, each cycle a reservation, then its release
/// reported twice at once: never deferred (each holds at most one of as
/// many places), each lease released once, every place free at the end,
/// every release one sample of the average.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn workers_that_each_hold_one_of_as_many_places_are_never_deferred(pool: PgPool) {
    create_flow(&pool, "api", 1_000_000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 64").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    const CYCLES: usize = 10;
    let mut workers = Vec::new();
    for _ in 0..64 {
        let app = app.clone();
        workers.push(tokio::spawn(async move {
            let mut deferred = 0;
            for _ in 0..CYCLES {
                let decision = app.reserve(json!({"flow": "invoice"})).await;
                if decision.outcome == Outcome::Deferred {
                    deferred += 1;
                    continue;
                }
                let lease = decision
                    .lease_id
                    .expect("a grant holds a place")
                    .to_string();
                let report = || async {
                    let answer = app
                        .post_json("/v1/report", json!({"flow": "invoice", "lease_id": lease}))
                        .await;
                    answer["released"] == Value::Bool(true)
                };
                let (first, second) = tokio::join!(report(), report());
                assert!(first ^ second, "released exactly once: {first} {second}");
            }
            deferred
        }));
    }
    let mut deferred = 0;
    for worker in workers {
        deferred += worker.await.unwrap();
    }
    assert_eq!(deferred, 0, "no worker was deferred");
    assert_eq!(free_places(&pool, "api").await, 64);
    assert_eq!(average(&pool, "invoice").await.1, (64 * CYCLES) as i64);
}

/// A bucket whose factor was set a while ahead, so that no recovery runs
/// between reports: the folds compare exactly.
async fn adaptive(pool: &PgPool, quota: &str) {
    create_flow(pool, quota, 1_000_000, &format!("{quota}-flow"), "enforce").await;
    set_limits(pool, quota, "rate = 10, burst = 5, adaptive = true").await;
    sqlx::query(
        "INSERT INTO quota_bucket (quota, tokens, refilled_at, factor, factor_at)
         VALUES ($1, 5, arbiter_now(), 1, arbiter_now() + interval '1 hour')
         ON CONFLICT (quota) DO UPDATE SET factor = 1, factor_at = EXCLUDED.factor_at",
    )
    .bind(quota)
    .execute(pool)
    .await
    .unwrap();
}

/// Upstream reports folded as a group leave each quota's factor where one
/// report after the other would, clamps included (a success at 1 stays at
/// 1, a storm stops at the floor that keeps the rate at 0.01/s).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_group_of_upstream_reports_adapts_as_one_after_another(pool: PgPool) {
    for quota in ["one", "group", "storm"] {
        adaptive(&pool, quota).await;
    }
    let store = Store::new(pool.clone());
    let statuses = [200, 429, 200, 429, 429, 0, 503, 200];
    let mut one_by_one = Vec::new();
    for status in statuses {
        let adapted = store
            .adapt_cadences(&[("one".to_string(), status)])
            .await
            .unwrap();
        one_by_one.push(adapted[0].unwrap().factor);
    }
    // The group's reports, interleaved with another quota's storm.
    let mut reports = Vec::new();
    for status in statuses {
        reports.push(("group".to_string(), status));
        reports.extend(std::iter::repeat_n(("storm".to_string(), 429), 4));
    }
    let adapted = store.adapt_cadences(&reports).await.unwrap();
    let group: Vec<f64> = adapted
        .iter()
        .zip(&reports)
        .filter(|(_, (quota, _))| quota == "group")
        .map(|(a, _)| a.unwrap().factor)
        .collect();
    for (n, (one, group)) in one_by_one.iter().zip(&group).enumerate() {
        assert!(
            (one - group).abs() < 1e-12,
            "report {n}: {one} against {group}"
        );
    }
    // 1 (a success at 1), 0.7, 0.735, 0.5145, 0.36015, 0.28812, 0.259308, 0.2722734.
    assert!((group[7] - 0.2722734).abs() < 1e-9, "{group:?}");
    let storm = adapted.last().unwrap().unwrap();
    assert!((storm.factor - 0.001).abs() < 1e-12, "the floor: {storm:?}");
    assert!((storm.effective_rate - 0.01).abs() < 1e-12);
    assert_eq!(storm.effective_burst, 1.0);
}

/// 40 claimed items on 40 places finished at once, each twice: done twice
/// (the second a no-op that answers the item) for half of them, released
/// twice (the second finds it pending: 409) for the others. Every place is
/// free once, every item in the state its first finish left it.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_finishes_of_work_items_each_finish_once(pool: PgPool) {
    create_flow(&pool, "api", 1_000_000, "sync", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 40").await;
    let app = Arc::new(TestApp::spawn(pool.clone()).await);
    crate::work::enqueue_n(&app, "sync", 40).await;
    let claimed: Value = app
        .post_json("/v1/work/claim", json!({"worker": "w", "max": 40}))
        .await;
    let items: Vec<i64> = claimed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["item"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(items.len(), 40);
    assert_eq!(free_places(&pool, "api").await, 0);
    let mut finishes = Vec::new();
    for (n, id) in items.iter().enumerate() {
        let verb = if n % 2 == 0 { "done" } else { "release" };
        for _ in 0..2 {
            let app = app.clone();
            let path = format!("/v1/work/{id}/{verb}");
            finishes.push(tokio::spawn(async move {
                let answer = app
                    .post(&path)
                    .json(&json!({"worker": "w"}))
                    .send()
                    .await
                    .unwrap();
                (verb, answer.status().as_u16())
            }));
        }
    }
    let mut statuses: Vec<(&str, u16)> = Vec::new();
    for finish in finishes {
        statuses.push(finish.await.unwrap());
    }
    let count = |verb: &str, status: u16| statuses.iter().filter(|s| **s == (verb, status)).count();
    assert_eq!(count("done", 200), 40, "done twice: both answer the item");
    assert_eq!(count("release", 200), 20, "each release once");
    assert_eq!(statuses.len(), 80);
    assert_eq!(free_places(&pool, "api").await, 40);
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM work_item GROUP BY state ORDER BY state")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(states, [("done".into(), 20), ("pending".into(), 20)]);
}

/// A lease lasts twice its flow's average hold time, never under 5 s nor
/// over 60 s, and 30 s before any history: the average's blend reaches the
/// next lease.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_lease_lasts_twice_the_average_hold_between_5_and_60_seconds(pool: PgPool) {
    create_flow(&pool, "api", 1_000_000, "invoice", "enforce").await;
    set_limits(&pool, "api", "max_in_flight = 4").await;
    let (store, quota) = (Store::new(pool.clone()), places("api", 4));
    let lease_seconds = |lease_id: i64| {
        let pool = pool.clone();
        async move {
            let seconds: f64 = sqlx::query_scalar(
                "SELECT extract(epoch FROM valid_until - taken_at)::float8
                 FROM quota_place WHERE lease_id = $1",
            )
            .bind(lease_id)
            .fetch_one(&pool)
            .await
            .unwrap();
            seconds
        }
    };
    let mut held = Vec::new();
    // No history: 30 s. Then held 1 s (average 1: 5 s, the floor), 20 s
    // (1 × 0.9 + 20 × 0.1 = 2.9: 5.8 s), 400 s (2.9 × 0.9 + 40 = 42.61: the
    // 60 s cap).
    for (held_seconds, expected) in [(1.0, 30.0), (20.0, 5.0), (400.0, 5.8), (0.0, 60.0)] {
        let lease = leases(&store, &quota, "invoice", 1).await[0];
        let seconds = lease_seconds(lease).await;
        assert!(
            (seconds - expected).abs() < 1e-6,
            "{seconds} s, expected {expected} s"
        );
        assert!(store
            .release_lease(lease, Some(held_seconds))
            .await
            .unwrap()
            .is_some());
        held.push(held_seconds);
    }
    assert_eq!(average(&pool, "invoice").await.1, 4, "{held:?}");
}
