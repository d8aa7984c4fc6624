//! The ledger of counts made after the fact (src/tally.rs): what a flush
//! writes of each kind of count, that a failed flush keeps every number for
//! the next one, and that the last flush at shutdown returns as soon as
//! nothing is left.

use std::time::{Duration, Instant};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use quota_arbiter::domain::decision::{Decision, Outcome};
use quota_arbiter::tally::Ledger;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// A decision of flow `invoice` on quota `ppf`, counted in `window`.
fn decided(outcome: Outcome, would_defer: bool, window: DateTime<Utc>) -> Decision {
    let mut decision = Decision::new(outcome, "invoice");
    decision.quota = Some("ppf".into());
    decision.window_start = Some(window);
    decision.would_defer = would_defer;
    decision
}

/// Every kind of tally, some of them more than once, and slots spent after
/// the fact: (granted, deferred, would_defer, bypassed, unthrottled,
/// would_defer_with_deadline) = (4, 2, 2, 1, 2, 1), and 5 slots.
fn record_everything(ledger: &Ledger, window: DateTime<Utc>) {
    for _ in 0..2 {
        ledger.tally(&decided(Outcome::Granted, false, window), false);
        ledger.tally(&decided(Outcome::Deferred, false, window), false);
    }
    // Observed grants that enforcement would have deferred, one of them
    // with a deadline.
    ledger.tally(&decided(Outcome::Granted, true, window), true);
    ledger.tally(&decided(Outcome::Granted, true, window), false);
    // A deadline alone makes no would-defer.
    ledger.tally(&decided(Outcome::Bypassed, false, window), true);
    ledger.tally(&decided(Outcome::Unthrottled, false, window), true);
    ledger.tally(&decided(Outcome::Unthrottled, false, window), false);
    ledger.spend_after_the_fact("ppf", Some(window), 2);
    ledger.spend_after_the_fact("ppf", Some(window), 3);
}

type Tallies = (i64, i64, i64, i64, i64, i64);

async fn written(pool: &PgPool, window: DateTime<Utc>) -> (Tallies, i64) {
    let tallies = sqlx::query_as::<_, Tallies>(
        "SELECT granted, deferred, would_defer, bypassed, unthrottled, would_defer_with_deadline
         FROM decision_tally WHERE quota = 'ppf' AND flow = 'invoice' AND window_start = $1",
    )
    .bind(window)
    .fetch_one(pool)
    .await
    .unwrap();
    let count: Option<i64> = sqlx::query_scalar(
        "SELECT count FROM quota_window WHERE quota = 'ppf' AND window_start = $1",
    )
    .bind(window)
    .fetch_optional(pool)
    .await
    .unwrap();
    (tallies, count.unwrap_or(0))
}

async fn with_quota(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query("INSERT INTO quota (name, hourly_ceiling) VALUES ('ppf', 100)")
        .execute(pool)
        .await
        .unwrap();
    Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap()
}

/// A ledger holding [`record_everything`], of a quota the store knows.
async fn everything_recorded(pool: &PgPool) -> (Ledger, DateTime<Utc>) {
    let window = with_quota(pool).await;
    let ledger = Ledger::default();
    record_everything(&ledger, window);
    (ledger, window)
}

/// The last flush at shutdown, which must be done in well under its grace.
async fn last_flush(ledger: &Ledger, pool: &PgPool) {
    let grace = Duration::from_secs(10);
    let started = Instant::now();
    ledger.flush_before_exit(&pool.clone().into(), grace).await;
    let took = started.elapsed();
    assert!(
        took < grace / 2,
        "the last flush took {took:?} of its {grace:?}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_flush_writes_each_tally_and_the_slots_spent(pool: PgPool) {
    let (ledger, window) = everything_recorded(&pool).await;
    ledger.flush(&pool.clone().into()).await.unwrap();
    assert_eq!(written(&pool, window).await, ((4, 2, 2, 1, 2, 1), 5));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_failed_flush_keeps_every_number_for_the_next_one(pool: PgPool) {
    let (ledger, window) = everything_recorded(&pool).await;
    // A pool of its own, closed: the flush fails before it writes anything.
    let options = pool.connect_options().as_ref().clone();
    let closed = PgPoolOptions::new().connect_lazy_with(options);
    closed.close().await;
    assert!(
        ledger.flush(&closed.into()).await.is_err(),
        "a closed pool writes nothing"
    );
    // Numbers made while the failed batch was out join it.
    ledger.tally(&decided(Outcome::Granted, false, window), false);
    ledger.spend_after_the_fact("ppf", Some(window), 1);
    ledger.flush(&pool.clone().into()).await.unwrap();
    assert_eq!(written(&pool, window).await, ((5, 2, 2, 1, 2, 1), 6));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_last_flush_returns_as_soon_as_nothing_is_left(pool: PgPool) {
    let (ledger, window) = everything_recorded(&pool).await;
    last_flush(&ledger, &pool).await;
    assert_eq!(written(&pool, window).await, ((4, 2, 2, 1, 2, 1), 5));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn late_would_defers_and_reported_bypasses_join_the_flows_tallies(pool: PgPool) {
    let window = with_quota(&pool).await;
    let ledger = Ledger::default();
    // Observed decisions answered before the store said they were over the
    // ceiling, one with a deadline.
    ledger.tally_late_would_defer(window, "ppf", "invoice", true);
    ledger.tally_late_would_defer(window, "ppf", "invoice", false);
    // Due work a worker client let through while the arbiter was out of reach.
    ledger.tally_reported_bypasses(Some(window), "ppf", "invoice", 3);
    ledger.flush(&pool.clone().into()).await.unwrap();
    assert_eq!(written(&pool, window).await, ((0, 0, 2, 3, 0, 1), 0));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_last_flush_tries_again_until_the_store_takes_it(pool: PgPool) {
    let window = with_quota(&pool).await;
    let ledger = Ledger::default();
    // Slots of a quota the store does not know yet: the flush fails (the
    // window's quota must exist) until it is created, a moment later.
    ledger.spend_after_the_fact("later", Some(window), 2);
    let creator = pool.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("INSERT INTO quota (name, hourly_ceiling) VALUES ('later', 100)")
            .execute(&creator)
            .await
            .unwrap();
    });
    last_flush(&ledger, &pool).await;
    let count: i64 = sqlx::query_scalar(
        "SELECT count FROM quota_window WHERE quota = 'later' AND window_start = $1",
    )
    .bind(window)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(count, 2, "written by a later try");
}
