//! Window alignment: fixed UTC hours by the database clock, whatever TimeZone.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeZone, Timelike, Utc};
use quota_arbiter::domain::catalog::QuotaRule;
use quota_arbiter::domain::decision::{Decision, Limit, Outcome};
use quota_arbiter::domain::window::WindowRule;
use quota_arbiter::store::{QuotaAsk, QuotaTake, Store};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

use crate::helpers::{create_flow, db_now, eventually, pin_clock, pin_clock_at, TestApp};

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn window_start_of_is_the_utc_hour_under_a_half_hour_offset_session(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET TIME ZONE 'Asia/Kolkata'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let (aligned, naive): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT window_start_of('2026-11-30T14:45:00Z'), date_trunc('hour', '2026-11-30T14:45:00Z'::timestamptz)",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        aligned,
        Utc.with_ymd_and_hms(2026, 11, 30, 14, 0, 0).unwrap()
    );
    // What a naive date_trunc would do in this session: 14:30Z, not a UTC hour.
    assert_eq!(
        naive,
        Utc.with_ymd_and_hms(2026, 11, 30, 14, 30, 0).unwrap()
    );
    let end: DateTime<Utc> = sqlx::query_scalar("SELECT window_end_of('2026-11-30T14:59:59.999Z')")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(end, Utc.with_ymd_and_hms(2026, 11, 30, 15, 0, 0).unwrap());
}

/// Instants around daylight-saving changes and odd offsets, each read in
/// sessions of zones whose hours are not UTC's (half and quarter hours, a
/// half-hour daylight saving): every window bound is the UTC one.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn window_bounds_are_utc_hours_in_every_session_time_zone(pool: PgPool) {
    let zones = [
        "UTC",
        "Asia/Kolkata",
        "Asia/Kathmandu",
        "America/St_Johns",
        "Australia/Lord_Howe",
        "Europe/London",
        "America/New_York",
    ];
    let instants: Vec<DateTime<Utc>> = [
        "2026-03-08T06:59:59.999999Z", // New York springs forward at 07:00Z
        "2026-03-08T07:00:00Z",
        "2026-03-29T01:30:00Z", // London, at 01:00Z
        "2026-04-04T15:15:00Z", // Lord Howe falls back half an hour, at 15:00Z
        "2026-10-04T15:45:00Z", // and springs forward, at 15:30Z
        "2026-11-01T05:59:59Z", // New York falls back at 06:00Z
        "2026-11-01T06:20:34.5Z",
        "2026-11-30T14:45:00Z",
        "2026-12-31T23:59:59.999999Z",
    ]
    .iter()
    .map(|t| t.parse().unwrap())
    .collect();
    let mut conn = pool.acquire().await.unwrap();
    for zone in zones {
        sqlx::query(&format!("SET TIME ZONE '{zone}'"))
            .execute(&mut *conn)
            .await
            .unwrap();
        for &ts in &instants {
            let start = ts.duration_trunc(chrono::Duration::hours(1)).unwrap();
            for seconds in [1, 10, 900] {
                let step = chrono::Duration::seconds(seconds);
                let admit_window = start + step * ((ts - start).num_seconds() / seconds) as i32;
                let bounds: (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
                    "SELECT window_start_of($1), window_end_of($1), admit_window_of($1, $2)",
                )
                .bind(ts)
                .bind(seconds as i32)
                .fetch_one(&mut *conn)
                .await
                .unwrap();
                let expected = (start, start + chrono::Duration::hours(1), admit_window);
                assert_eq!(bounds, expected, "{ts} in a {zone} session, {seconds} s");
            }
        }
    }
}

/// Every deciding statement reads its window's bounds: they must be
/// expressions the planner folds into the statement, not calls through the
/// SQL-function executor (which a body more volatile than its declaration
/// forces; design.md §5).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn window_bounds_are_inlined_into_the_statements_that_read_them(pool: PgPool) {
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (VERBOSE, COSTS OFF)
         SELECT window_start_of(arbiter_now()), window_end_of(arbiter_now()),
                admit_window_of(arbiter_now(), 10)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    for function in ["window_start_of", "window_end_of", "admit_window_of"] {
        assert!(!plan.contains(function), "{function} not inlined:\n{plan}");
    }
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn reservations_land_in_utc_hour_windows_when_sessions_are_not_utc(pool: PgPool) {
    // 40 minutes past the UTC hour is 10 past the hour in Kolkata: a naive
    // truncation would start the window half an hour off.
    let pinned = pin_clock(&pool, 40).await;
    create_flow(&pinned, "ppf", 10, "invoice", "enforce").await;
    // sqlx asks for UTC at connect time; a session can still change it.
    let kolkata = PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET TIME ZONE 'Asia/Kolkata'").await?;
                Ok(())
            })
        })
        .connect_with(pinned.connect_options().as_ref().clone())
        .await
        .unwrap();
    let zone: String = sqlx::query_scalar("SHOW TimeZone")
        .fetch_one(&kolkata)
        .await
        .unwrap();
    assert_eq!(zone, "Asia/Kolkata");

    let store = Store::new(kolkata.clone());
    let reservation = take(&store, "ppf", 1, 10).await;
    let start = reservation.clock.window_start;
    assert_eq!(
        (start.minute(), start.second(), start.nanosecond()),
        (0, 0, 0)
    );
    assert_eq!(
        reservation.clock.window_end - start,
        chrono::Duration::hours(1)
    );
    assert!(
        start <= reservation.clock.db_now
            && reservation.clock.db_now < reservation.clock.window_end
    );
    assert_eq!(reservation.clock.db_now.minute(), 40);

    // The same row is found from a UTC session: one window, not two.
    take(&store, "ppf", 2, 10).await;
    let rows: Vec<(DateTime<Utc>, i64)> =
        sqlx::query_as("SELECT window_start, count FROM quota_window WHERE quota = 'ppf'")
            .fetch_all(&pinned)
            .await
            .unwrap();
    assert_eq!(rows, vec![(start, 3)]);
}

/// `slots` of `quota` all or nothing, against `ceiling`: the statement that
/// decides every budget-only reservation, asked for one quota.
async fn take(store: &Store, quota: &str, slots: i64, ceiling: i64) -> QuotaTake {
    let ask = QuotaAsk {
        quota: quota.to_string(),
        windows: vec![WindowRule::hour(ceiling)],
        share: None,
        wanted: slots,
        smallest: slots,
    };
    store
        .take_slots_across(&[ask], false)
        .await
        .unwrap()
        .remove(0)
}

/// `slots` of `quota`'s hour spent regardless (observe mode).
fn observed_ask(quota: &str, slots: i64) -> QuotaAsk {
    QuotaAsk {
        quota: quota.to_string(),
        windows: vec![WindowRule::hour(1)],
        share: None,
        wanted: slots,
        smallest: slots,
    }
}

/// The hour's count after a take, `None` when it took nothing.
fn count_after(take: &QuotaTake) -> Option<i64> {
    (take.taken > 0).then(|| take.windows[0].count_before + take.taken)
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_conditional_upsert_refuses_with_zero_rows_and_spends_nothing(pool: PgPool) {
    create_flow(&pool, "ppf", 2, "invoice", "enforce").await;
    let store = Store::new(pool.clone());
    assert_eq!(count_after(&take(&store, "ppf", 2, 2).await), Some(2));
    let refused = take(&store, "ppf", 1, 2).await;
    assert_eq!((refused.taken, count_after(&refused)), (0, None));
    // Observe spends regardless and reports the honest count.
    let observed = store
        .take_slots_across(&[observed_ask("ppf", 1)], true)
        .await
        .unwrap();
    assert_eq!(count_after(&observed[0]), Some(3));
    // A ceiling of 0 with an empty window: the insert branch refuses too.
    create_flow(&pool, "closed", 0, "x", "enforce").await;
    assert_eq!(count_after(&take(&store, "closed", 1, 0).await), None);
    let counted: Vec<(String, i64)> =
        sqlx::query_as("SELECT quota, count FROM quota_window ORDER BY quota")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        counted,
        [("ppf".to_string(), 3)],
        "a refusal spends nothing"
    );
}

/// A claim's lane on a budget-only quota takes up to k slots: a take that got
/// all it asked for was stopped by nothing; one that fell short says the
/// window stopped it, until the window ends (after a new hour began, that is
/// at once, where the claim's backlog would say the new window's end).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_take_of_up_to_k_names_the_window_only_when_it_fell_short(pool: PgPool) {
    create_flow(&pool, "ppf", 3, "invoice", "enforce").await;
    let store = Store::new(pool.clone());
    let quota = QuotaRule {
        name: "ppf".into(),
        windows: vec![WindowRule::hour(3)],
        cadence: None,
        max_in_flight: None,
        priority2_share: None,
        priority3_share: None,
    };
    let all = store.take_slots(&quota, 2, None).await.unwrap();
    assert_eq!((all.taken, all.stopped_by), (2, None));
    let short = store.take_slots(&quota, 2, None).await.unwrap();
    assert_eq!(short.taken, 1);
    let stopped = short.stopped_by.expect("stopped short by the window");
    assert_eq!(stopped.limit, Limit::Budget);
    assert_eq!(stopped.retry_at, short.clock.window_end);
}

const TURN_CALLERS: usize = 16;
const TURN_CEILING: i64 = 20;

/// What one caller saw: the decision and when it was asked and answered,
/// both by the database clock (the client's clock moved by the offset).
struct Asked {
    decision: Decision,
    sent: DateTime<Utc>,
    answered: DateTime<Utc>,
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn decisions_straddling_the_hour_land_in_the_window_they_were_decided_in(pool: PgPool) {
    // Three seconds before a UTC hour by the database clock; start asking
    // 0.8 s before it and go on until 0.7 s after it.
    let pinned = pin_clock_at(&pool, 3597.0).await;
    create_flow(&pinned, "ppf", TURN_CEILING, "invoice", "enforce").await;
    // Counted after the fact: in the window its answer names, not the one
    // the database clock is in when the count is written.
    create_flow(&pinned, "feed", 1_000_000, "page-view", "count").await;
    let app = Arc::new(TestApp::spawn(pinned.clone()).await);
    let db_now = db_now(&pinned).await;
    let offset = db_now - Utc::now();
    let hour =
        db_now.duration_trunc(chrono::Duration::hours(1)).unwrap() + chrono::Duration::hours(1);
    let start = hour - chrono::Duration::milliseconds(800);
    let stop = hour + chrono::Duration::milliseconds(700);
    let wait = (start - (Utc::now() + offset))
        .to_std()
        .expect("set up before the turn");
    tokio::time::sleep(wait).await;

    let mut callers = Vec::new();
    for caller in 0..TURN_CALLERS {
        let app = app.clone();
        let flow = if caller % 4 == 0 {
            "page-view"
        } else {
            "invoice"
        };
        callers.push(tokio::spawn(async move {
            let mut asked = Vec::new();
            while Utc::now() + offset < stop {
                let sent = Utc::now() + offset;
                let decision = app.reserve(json!({"flow": flow})).await;
                let answered = Utc::now() + offset;
                asked.push(Asked {
                    decision,
                    sent,
                    answered,
                });
            }
            asked
        }));
    }
    let mut all = Vec::new();
    for caller in callers {
        all.extend(caller.await.unwrap());
    }

    let before = hour - chrono::Duration::hours(1);
    // The client's reading of the database clock is good to a round trip.
    let slack = chrono::Duration::milliseconds(50);
    for asked in &all {
        // Only a count made without a recent clock reading (right after the
        // turn) names no window: the flush's window counts it.
        let Some(window) = asked.decision.window_start else {
            assert_eq!(
                asked.decision.outcome,
                Outcome::Unthrottled,
                "an enforced decision has a window"
            );
            continue;
        };
        assert!(window == before || window == hour, "{window}");
        if window == before {
            assert!(
                asked.sent < hour + slack,
                "decided before the hour, asked at {}",
                asked.sent
            );
        } else {
            assert!(
                asked.answered > hour - slack,
                "decided after the hour, answered at {}",
                asked.answered
            );
        }
    }
    let spent = |window, outcome| {
        all.iter()
            .filter(|a| a.decision.window_start == Some(window))
            .filter(|a| a.decision.outcome == outcome)
            .count() as i64
    };
    let counted_in = |quota: &'static str, window| {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce((SELECT count FROM quota_window WHERE quota = $1 AND window_start = $2), 0)",
        )
        .bind(quota)
        .bind(window)
        .fetch_one(&pinned)
    };
    let page_views = all
        .iter()
        .filter(|a| a.decision.flow == "page-view")
        .count() as i64;
    let flushed = eventually(Duration::from_secs(5), page_views, || async {
        counted_in("feed", before).await.unwrap() + counted_in("feed", hour).await.unwrap()
    })
    .await;
    assert_eq!(flushed, page_views, "every page view counted");
    for window in [before, hour] {
        let granted = spent(window, Outcome::Granted);
        assert_eq!(
            counted_in("ppf", window).await.unwrap(),
            granted,
            "window {window}: its count is what was granted in it"
        );
        assert!(
            (1..=TURN_CEILING).contains(&granted),
            "window {window}: {granted} granted"
        );
        let unthrottled = spent(window, Outcome::Unthrottled);
        let unplaced = all
            .iter()
            .filter(|a| a.decision.flow == "page-view" && a.decision.window_start.is_none())
            .count() as i64;
        let counted = counted_in("feed", window).await.unwrap();
        assert!(
            counted >= unthrottled && counted <= unthrottled + unplaced,
            "window {window}: {counted} counted, {unthrottled} answered in it, {unplaced} in none"
        );
        assert!(
            unthrottled >= 1,
            "window {window}: page views on both sides"
        );
    }
}
