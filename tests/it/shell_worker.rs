//! `quota-arbiter reserve`, black-box: the real binary against a real
//! replica, answered by its exit status and stdout.

use std::process::Output;

use sqlx::PgPool;

use crate::helpers::{create_flow, pin_clock, set_limits, TestApp};

/// `quota-arbiter reserve ARGS` with the client pointed at `url`.
async fn reserve(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_quota-arbiter"))
        .arg("reserve")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("QUOTA_ARBITER_URL", url)
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .expect("the binary runs")
}

fn status_and_stdout(output: &Output) -> (i32, String) {
    let status = output.status.code().expect("exited, not killed");
    (
        status,
        String::from_utf8_lossy(&output.stdout).trim().to_string(),
    )
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn granted_exits_0_then_deferred_exits_75_with_the_seconds_to_wait(pool: PgPool) {
    let pool = pin_clock(&pool, 10).await;
    create_flow(&pool, "ppf", 1, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    let granted = reserve(&app.base, &["invoice", "--ref", "inv-1"], &[]).await;
    assert_eq!(status_and_stdout(&granted), (0, String::new()));

    // The window is full until the next hour, 50 minutes away.
    let deferred = reserve(&app.base, &["invoice"], &[]).await;
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
    let bypassed = reserve(&app.base, &["invoice", "--deadline", &due], &[]).await;
    assert_eq!(status_and_stdout(&bypassed), (0, String::new()));
    // And the count: 2 slots of an unknown flow are unthrottled.
    let unthrottled = reserve(&app.base, &["nobody", "--count", "2"], &[]).await;
    assert_eq!(status_and_stdout(&unthrottled), (0, String::new()));
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn wait_waits_out_the_deferral_then_exits_0(pool: PgPool) {
    create_flow(&pool, "api", 1000, "invoice", "enforce").await;
    set_limits(&pool, "api", "rate = 2, burst = 1").await;
    let app = TestApp::spawn(pool.clone()).await;

    assert_eq!(
        reserve(&app.base, &["invoice"], &[]).await.status.code(),
        Some(0)
    );
    let deferred = reserve(&app.base, &["invoice"], &[]).await;
    assert_eq!(deferred.status.code(), Some(75), "{deferred:?}");
    // The bucket refills a token in half a second: --wait gets it.
    let waited = reserve(&app.base, &["invoice", "--wait"], &[]).await;
    assert_eq!(status_and_stdout(&waited), (0, String::new()));
}

#[tokio::test]
async fn an_unreachable_arbiter_exits_69_after_the_retries() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let output = reserve(&url, &["invoice"], &[("QUOTA_RETRY_ATTEMPTS", "1")]).await;
    assert_eq!(status_and_stdout(&output), (69, String::new()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("quota arbiter unavailable after 1 attempts"),
        "{stderr}"
    );
}

#[tokio::test]
async fn bad_usage_exits_64() {
    let url = "http://127.0.0.1:9";
    for args in [
        &[][..],
        &["invoice", "--count", "0"],
        &["invoice", "--deadline", "soonish"],
        &["invoice", "--colour"],
    ] {
        let output = reserve(url, args, &[]).await;
        assert_eq!(output.status.code(), Some(64), "{args:?}: {output:?}");
    }
    let help = reserve(url, &["--help"], &[]).await;
    assert_eq!(help.status.code(), Some(0));
}
