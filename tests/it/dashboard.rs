//! The dashboard, rendered by a real headless Chromium.

use std::path::PathBuf;

use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{create_flow, find_on_path, TestApp};

fn chromium() -> Option<PathBuf> {
    find_on_path(&["chromium", "chromium-browser", "google-chrome"])
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_dashboard_shows_bars_and_numbers_in_chromium(pool: PgPool) {
    let Some(chromium) = chromium() else {
        eprintln!("SKIPPED the_dashboard_shows_bars_and_numbers_in_chromium: no chromium on PATH (.ci/run installs Debian's chromium)");
        return;
    };
    create_flow(&pool, "ppf", 4, "invoice", "enforce").await;
    create_flow(&pool, "ppf", 4, "status-report", "observe").await;
    let app = TestApp::spawn(pool).await;
    for _ in 0..3 {
        app.reserve(json!({"flow": "invoice"})).await;
    }
    for _ in 0..3 {
        app.reserve(json!({"flow": "status-report"})).await;
    }
    app.reserve(json!({"flow": "invoice"})).await; // 6 of 4 spent: deferred
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // tallies flushed

    let profile = tempdir();
    let output = tokio::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=2000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("{}/", app.base))
        .output()
        .await
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        dom.contains("<h1>quota-arbiter</h1>"),
        "rendered page:\n{dom}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The current window: a bar for ppf's hour with its numbers, over the ceiling.
    assert!(
        dom.contains(r#"<div class="quota" data-quota="ppf" data-period="1h">"#),
        "{dom}"
    );
    assert!(
        dom.contains(r#"<b class="count">6</b> / <b class="ceiling">4</b>"#),
        "{dom}"
    );
    assert!(dom.contains(r#"class="used over" data-count="6""#), "{dom}");
    // The last windows: stacked bars in distinct series.
    for series in [
        r#"class="granted" data-value="4""#,
        r#"class="would-defer" data-value="2""#,
        r#"class="deferred" data-value="1""#,
    ] {
        assert!(dom.contains(series), "missing {series} in {dom}");
    }
    // Each flow with its mode and how to flip it.
    assert!(dom.contains("quota-arbiter flow invoice observe"), "{dom}");
    assert!(
        dom.contains(r#"<span class="mode observe">observe</span>"#),
        "{dom}"
    );
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "qa-chromium-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}
