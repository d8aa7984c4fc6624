//! `quota-arbiter-client reserve`, the shell worker's command, against a
//! real replica: the client crate's command as its binary runs it (arguments
//! and the client's settings in, exit status and stdout out). Its usage,
//! help and an unreachable arbiter are checked on the built binary in
//! client/tests/command.rs.

use std::collections::HashMap;

use quota_arbiter_client::command::{self, Answer};
use quota_arbiter_client::Settings;
use sqlx::PgPool;

use crate::helpers::{create_flow, pin_clock, set_limits, TestApp};

/// `quota-arbiter-client reserve ARGS` with the client pointed at `url`.
async fn reserve(url: &str, args: &[&str]) -> Answer {
    let vars = HashMap::from([("QUOTA_ARBITER_URL".to_string(), url.to_string())]);
    let (settings, warnings) = Settings::from_vars(&vars);
    assert!(warnings.is_empty(), "{warnings:?}");
    let argv = ["quota-arbiter-client", "reserve"]
        .iter()
        .chain(args)
        .map(Into::into);
    command::run(argv, settings).await
}

fn status_and_stdout(answer: &Answer) -> (u8, String) {
    (answer.status, answer.stdout.clone().unwrap_or_default())
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn granted_exits_0_then_deferred_exits_75_with_the_seconds_to_wait(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    let granted = reserve(&app.base, &["invoice", "--ref", "inv-1"]).await;
    assert_eq!(status_and_stdout(&granted), (0, String::new()));

    // The window is full until the next hour, 50 minutes away.
    let deferred = reserve(&app.base, &["invoice"]).await;
    let (status, seconds) = status_and_stdout(&deferred);
    assert_eq!(status, 75, "{deferred:?}");
    let seconds: i64 = seconds.parse().expect("whole seconds on stdout");
    assert!((2_990..=3_000).contains(&seconds), "{seconds}");

    // The deadline reaches the arbiter: due within its bypass horizon (by
    // the database clock, which the test moved), emit.
    let due: String = sqlx::query_scalar(
        "SELECT to_char((arbiter_now() + interval '5 minutes') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let bypassed = reserve(&app.base, &["invoice", "--deadline", &due]).await;
    assert_eq!(status_and_stdout(&bypassed), (0, String::new()));
    // And the count: 2 slots of an unknown flow are unthrottled.
    let unthrottled = reserve(&app.base, &["nobody", "--count", "2"]).await;
    assert_eq!(status_and_stdout(&unthrottled), (0, String::new()));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn wait_waits_out_the_deferral_then_exits_0(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 2, burst = 1").await;
    let app = TestApp::spawn(pool.clone()).await;

    assert_eq!(reserve(&app.base, &["invoice"]).await.status, 0);
    let deferred = reserve(&app.base, &["invoice"]).await;
    assert_eq!(deferred.status, 75, "{deferred:?}");
    // The bucket refills a token in half a second: --wait gets it.
    let waited = reserve(&app.base, &["invoice", "--wait"]).await;
    assert_eq!(status_and_stdout(&waited), (0, String::new()));
}
