//! `quota-arbiter-client`, the built binary, black-box: what a shell worker
//! sees of its usage, its help and an arbiter nobody answers for. Its answers
//! from a real arbiter are checked in the service's tests/it/shell_worker.rs.

use std::process::Output;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_quota-arbiter-client"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .output()
        .expect("the binary runs")
}

#[test]
fn an_unreachable_arbiter_exits_69_after_the_retries() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let output = run(
        &["reserve", "invoice"],
        &[("QUOTA_ARBITER_URL", &url), ("QUOTA_RETRY_ATTEMPTS", "1")],
    );
    assert_eq!(output.status.code(), Some(69), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("quota arbiter unavailable after 1 attempts"),
        "{stderr}"
    );
}

#[test]
fn bad_usage_exits_64() {
    let url = [("QUOTA_ARBITER_URL", "http://127.0.0.1:9")];
    for args in [
        &["reserve"][..],
        &["reserve", "invoice", "--count", "0"],
        &["reserve", "invoice", "--deadline", "soonish"],
        &["reserve", "invoice", "--colour"],
        &[],
        &["emit", "invoice"],
    ] {
        let output = run(args, &url);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {output:?}");
    }
    for help in [&["--help"][..], &["reserve", "--help"]] {
        let output = run(help, &url);
        assert_eq!(output.status.code(), Some(0), "{help:?}: {output:?}");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("reserve"),
            "{output:?}"
        );
    }
}
