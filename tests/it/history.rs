//! History that does not grow forever: windows and tallies past
//! `history_retention`, the audit trail past `audit_retention`, pruned in
//! batches by every replica; the report says how far back it can look.
// figment's Jail closures return figment::Error, which is large by design.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use figment::Jail;
use quota_arbiter::config::Config;
use quota_arbiter::store::Store;
use reqwest::Method;
use sqlx::PgPool;

use crate::helpers::{cli, stdout};
use crate::helpers::{eventually, pin_clock, test_config, TestApp};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// With the clock pinned at :30, windows of the current hour and the 6 before
/// it, a tally in each, an unknown flow's tally (no quota) 5 hours back, and
/// audit entries 40 and 10 days old besides the quota's own.
async fn history(pool: &PgPool) -> PgPool {
    let pool = pin_clock(pool, 30).await;
    sqlx::raw_sql(
        "INSERT INTO quota (name, hourly_ceiling) VALUES ('ppf', 10);
         INSERT INTO quota_window (quota, period, window_start, count)
         SELECT 'ppf', '1h', window_start_of(arbiter_now()) - make_interval(hours => h), 1
         FROM generate_series(0, 6) h;
         INSERT INTO decision_tally (window_start, quota, flow, granted)
         SELECT window_start_of(arbiter_now()) - make_interval(hours => h), 'ppf', 'invoice', 1
         FROM generate_series(0, 6) h;
         INSERT INTO decision_tally (window_start, quota, flow, unthrottled)
         VALUES (window_start_of(arbiter_now()) - interval '5 hours', NULL, 'nobody', 1);
         INSERT INTO catalog_audit (changed_at, actor, entity, name, field, to_value)
         VALUES (arbiter_now() - interval '40 days', 'sql:old', 'quota', 'ppf', 'hourly_ceiling', '5'),
                (arbiter_now() - interval '10 days', 'sql:old', 'quota', 'ppf', 'hourly_ceiling', '8');",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

/// Hours back (0: the current window) of the windows and tallies kept, and
/// how many audit entries.
async fn kept(pool: &PgPool) -> (Vec<i32>, Vec<i32>, i64) {
    let hours_back = |table: &str| {
        format!(
            "SELECT (extract(epoch FROM window_start_of(arbiter_now()) - window_start) / 3600)::int
             FROM {table} ORDER BY 1"
        )
    };
    let windows = sqlx::query_scalar(&hours_back("quota_window"))
        .fetch_all(pool)
        .await
        .unwrap();
    let tallies = sqlx::query_scalar(&hours_back("decision_tally"))
        .fetch_all(pool)
        .await
        .unwrap();
    let audit = sqlx::query_scalar("SELECT count(*) FROM catalog_audit")
        .fetch_one(pool)
        .await
        .unwrap();
    (windows, tallies, audit)
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn pruning_goes_oldest_first_a_batch_at_a_time_and_keeps_the_recent_hours(pool: PgPool) {
    let pool = history(&pool).await;
    let store = Store::new(pool.clone());
    let (_, _, audit_before) = kept(&pool).await;

    // Kept for 2 hours: windows that ended 2.5 hours ago or more go (3..6 back).
    let mut batches = Vec::new();
    loop {
        let pruned = store.prune_windows(2 * HOUR, 3).await.unwrap();
        batches.push(pruned);
        if pruned == 0 {
            break;
        }
        if batches.len() == 1 {
            assert_eq!(kept(&pool).await.0, [0, 1, 2, 3], "oldest first");
        }
    }
    assert_eq!(batches, [3, 1, 0]);
    let mut batches = Vec::new();
    while batches.last() != Some(&0) {
        batches.push(store.prune_tallies(2 * HOUR, 2).await.unwrap());
    }
    assert_eq!(batches, [2, 2, 1, 0], "the unknown flow's tally too");
    assert_eq!(
        store.prune_audit(30 * DAY, 5000).await.unwrap(),
        1,
        "only the entry older than 30 days"
    );

    let (windows, tallies, audit) = kept(&pool).await;
    assert_eq!(
        windows,
        [0, 1, 2],
        "the current window and the two before it"
    );
    assert_eq!(tallies, [0, 1, 2]);
    assert_eq!(audit, audit_before - 1);

    // However short the retention, the current window has not ended.
    store
        .prune_windows(Duration::from_secs(1), 5000)
        .await
        .unwrap();
    store
        .prune_tallies(Duration::from_secs(1), 5000)
        .await
        .unwrap();
    assert_eq!(kept(&pool).await.0, [0]);
    assert_eq!(kept(&pool).await.1, [0]);
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_replica_prunes_history_past_its_retention_by_itself(pool: PgPool) {
    let pool = history(&pool).await;
    let config = Config {
        history_retention: 2 * HOUR,
        audit_retention: 30 * DAY,
        ..test_config()
    };
    let app = TestApp::spawn_with(pool.clone(), config).await;
    let windows = eventually(Duration::from_secs(10), vec![0, 1, 2], || async {
        kept(&pool).await.0
    })
    .await;
    assert_eq!(
        windows,
        [0, 1, 2],
        "the current window and the two before it"
    );
    let tallies = eventually(Duration::from_secs(10), vec![0, 1, 2], || async {
        kept(&pool).await.1
    })
    .await;
    assert_eq!(tallies, [0, 1, 2]);
    let old_audit: i64 = eventually(Duration::from_secs(10), 0, || async {
        sqlx::query_scalar("SELECT count(*) FROM catalog_audit WHERE actor = 'sql:old' AND changed_at < arbiter_now() - interval '30 days'")
            .fetch_one(&pool)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(old_audit, 0);
    let recent_audit: i64 =
        sqlx::query_scalar("SELECT count(*) FROM catalog_audit WHERE actor = 'sql:old'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(recent_audit, 1, "the 10-day-old entry is kept");

    // The report says how far back it can look, and that 7 days is too far.
    let report = app
        .admin_json(Method::GET, "/v1/report?since=7d", None)
        .await;
    assert_eq!(report["history_retention"], "2h", "{report}");
    let oldest: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT window_start_of(arbiter_now()) - interval '2 hours'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        report["oldest_tally"],
        serde_json::to_value(oldest).unwrap()
    );
    let reach = report["reach"].as_str().unwrap();
    assert!(
        reach.starts_with("the last 168 hours were asked for, but tallies are kept for 2h: the report cannot look back further (the oldest kept is from "),
        "{reach}"
    );
    let report = app
        .admin_json(Method::GET, "/v1/report?since=2h", None)
        .await;
    let reach = report["reach"].as_str().unwrap();
    assert!(
        reach.starts_with("tallies are kept for 2h; the oldest kept is from "),
        "{reach}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_retention_of_zero_keeps_history_and_the_audit_trail_is_kept_by_default(pool: PgPool) {
    let pool = history(&pool).await;
    // A done work item a day old: once it is gone, a pruning pass has run.
    sqlx::query(
        "INSERT INTO work_item (flow, priority, payload, state, done_at)
         VALUES ('invoice', 2, '{}', 'done', arbiter_now() - interval '1 day')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let before = kept(&pool).await;
    let config = Config {
        history_retention: Duration::ZERO,
        work_retention: HOUR,
        ..test_config()
    };
    assert_eq!(config.audit_retention, Duration::ZERO, "kept by default");
    let app = TestApp::spawn_with(pool.clone(), config).await;
    let done_items: i64 = eventually(Duration::from_secs(10), 0, || async {
        sqlx::query_scalar("SELECT count(*) FROM work_item")
            .fetch_one(&pool)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(done_items, 0, "the pruning pass ran");
    assert_eq!(kept(&pool).await, before);

    let report = app
        .admin_json(Method::GET, "/v1/report?since=366d", None)
        .await;
    assert_eq!(report["history_retention"], serde_json::Value::Null);
    let reach = report["reach"].as_str().unwrap();
    assert!(
        reach.starts_with("tallies are kept forever; the oldest kept is from "),
        "{reach}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_cli_report_says_how_far_back_it_can_look(pool: PgPool) {
    // The CLI reads its retention from its own configuration: 90 days by default.
    let report = stdout(&cli(&pool, &["report", "--since", "100d"]).await);
    assert_eq!(
        report.lines().next(),
        Some("(the last 2400 hours were asked for, but tallies are kept for 90d: the report cannot look back further (none is kept yet))"),
        "{report}"
    );
    let report = stdout(&cli(&pool, &["report", "--since", "7d"]).await);
    assert_eq!(
        report.lines().next(),
        Some("(tallies are kept for 90d; none is kept yet)"),
        "{report}"
    );
}

#[test]
fn history_is_kept_90_days_and_the_audit_trail_forever_unless_configured() {
    Jail::expect_with(|jail| {
        let config = Config::load().unwrap();
        assert_eq!(config.history_retention, 90 * DAY);
        assert_eq!(config.audit_retention, Duration::ZERO);
        jail.create_file(
            "quota-arbiter.toml",
            "history_retention = \"30d\"\naudit_retention = \"400d\"\n",
        )?;
        let config = Config::load().unwrap();
        assert_eq!(
            (config.history_retention, config.audit_retention),
            (30 * DAY, 400 * DAY)
        );
        jail.set_env("QUOTA_HISTORY_RETENTION", "0s");
        jail.set_env("QUOTA_AUDIT_RETENTION", "2y");
        let config = Config::load().unwrap();
        assert_eq!(config.history_retention, Duration::ZERO);
        assert!(config.audit_retention > 700 * DAY);
        let printed = format!("{config:?}");
        assert!(
            printed.contains("history_retention") && printed.contains("audit_retention"),
            "{printed}"
        );
        jail.set_env("QUOTA_HISTORY_RETENTION", "a while");
        let error = Config::load().unwrap_err().to_string();
        assert!(
            error.contains("history_retention") && error.contains("QUOTA_HISTORY_RETENTION"),
            "{error}"
        );
        Ok(())
    });
}
