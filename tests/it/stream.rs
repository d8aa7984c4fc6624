//! `GET /v1/stream`: the share broadcast, read as a worker reads it.

use std::time::Duration;

use chrono::DurationRound;

use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::TestApp;

/// A connected share stream, read event by event.
struct ShareStream {
    response: reqwest::Response,
    buffered: String,
}

impl ShareStream {
    async fn connect(app: &TestApp, query: &str) -> Self {
        let response = app
            .get(&format!("/v1/stream?{query}"))
            .send()
            .await
            .expect("request sent");
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            response,
            buffered: String::new(),
        }
    }

    /// The next `share` event's data, within `within`.
    async fn next_share(&mut self, within: Duration) -> Value {
        tokio::time::timeout(within, async {
            loop {
                if let Some(end) = self.buffered.find("\n\n") {
                    let frame: String = self.buffered.drain(..end + 2).collect();
                    if frame.lines().any(|line| line == "event: share") {
                        let data = frame
                            .lines()
                            .find_map(|line| line.strip_prefix("data: "))
                            .expect("a share event carries data");
                        return serde_json::from_str(data).expect("JSON data");
                    }
                    continue;
                }
                let chunk = self.response.chunk().await.unwrap().expect("stream open");
                self.buffered.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .expect("a share event in time")
    }
}

async fn put_quota(app: &TestApp, body: Value) {
    app.admin_json(Method::PUT, "/v1/quotas/api", Some(body))
        .await;
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn clients_receive_their_share_and_every_change_within_a_second(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    put_quota(
        &app,
        json!({"hourly_ceiling": 1000, "rate": 10.0, "burst": 5.0}),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/invoice",
        Some(json!({"quota": "api", "mode": "enforce"})),
    )
    .await;

    let mut first = ShareStream::connect(&app, "flow=invoice&flow=nobody").await;
    let mut share = first.next_share(Duration::from_secs(2)).await;
    // When the hour ends, by the database clock and from the event on.
    let window = share["quotas"][0]["windows"][0].as_object_mut().unwrap();
    let ends_at: chrono::DateTime<chrono::Utc> = window
        .remove("ends_at")
        .unwrap()
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let ends_in = window.remove("ends_in_seconds").unwrap().as_f64().unwrap();
    let hour_end = crate::helpers::db_now(&pool)
        .await
        .duration_trunc(chrono::TimeDelta::hours(1));
    assert_eq!(ends_at, hour_end.unwrap() + chrono::TimeDelta::hours(1));
    assert!((0.0..=3600.0).contains(&ends_in), "{ends_in}");
    assert_eq!(
        share,
        json!({"quotas": [{"quota": "api", "rate": 10.0, "burst": 5.0,
            "configured_rate": 10.0, "configured_burst": 5.0, "hourly_ceiling": 1000,
            "windows": [{"period": "1h", "ceiling": 1000, "seconds": 3600, "left": 1000}],
            "clients": 1, "flows": [{"flow": "invoice", "fallback": "off"}]}],
            // The default horizon, 15 minutes: the fallback's bypass rule.
            "bypass_horizon_seconds": 900.0})
    );

    put_quota(
        &app,
        json!({"hourly_ceiling": 1000, "rate": 20.0, "burst": 5.0}),
    )
    .await;
    // One beat (1 s) and the query: "about a second", with room for a busy CI.
    let share = first.next_share(Duration::from_millis(1_800)).await;
    assert_eq!(share["quotas"][0]["rate"], 20.0, "{share}");

    // Another replica's client of the same quota counts too.
    let other_replica = TestApp::spawn(pool.clone()).await;
    let mut second = ShareStream::connect(&other_replica, "flow=invoice").await;
    let share = second.next_share(Duration::from_secs(2)).await;
    assert_eq!(share["quotas"][0]["clients"], 2, "{share}");
    let share = first.next_share(Duration::from_millis(1_800)).await;
    assert_eq!(share["quotas"][0]["clients"], 2, "{share}");

    // A client that leaves stops counting at once.
    drop(second);
    let share = first.next_share(Duration::from_millis(2_500)).await;
    assert_eq!(share["quotas"][0]["clients"], 1, "{share}");
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_stream_without_flows_is_refused(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let response = app.get("/v1/stream").send().await.unwrap();
    assert_eq!(response.status(), 422);
}

/// A flow that spends several quotas follows the share of each (the client
/// keeps the tightest): every one of them is in its stream's event.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_flow_of_several_quotas_hears_the_share_of_each(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    put_quota(&app, json!({"hourly_ceiling": 1000})).await;
    app.admin_json(
        Method::PUT,
        "/v1/quotas/tokens",
        Some(json!({"windows": [{"period": "1m", "ceiling": 600}]})),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/chat",
        Some(json!({"quotas": ["api", "tokens"], "mode": "enforce", "fallback": "local"})),
    )
    .await;
    let mut stream = ShareStream::connect(&app, "flow=chat").await;
    let share = stream.next_share(Duration::from_secs(2)).await;
    let quotas: Vec<(&str, &Value)> = share["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["quota"].as_str().unwrap(), &q["flows"][0]["flow"]))
        .collect();
    assert_eq!(
        quotas,
        [("api", &json!("chat")), ("tokens", &json!("chat"))],
        "{share}"
    );
}

/// What each window has left goes out with the share (the local fallback
/// spends within it, design.md §13), once it moved by more than 1 % of the
/// ceiling; and beside a slowed cadence, the cadence as configured, which a
/// client's local rate recovers toward.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_share_tells_what_each_window_has_left_and_the_configured_cadence(pool: PgPool) {
    let pool = crate::helpers::pin_clock(&pool, 10).await;
    let app = TestApp::spawn(pool.clone()).await;
    put_quota(
        &app,
        json!({"windows": [{"period": "1h", "ceiling": 100}], "rate": 10.0, "burst": 5.0,
               "adaptive": true}),
    )
    .await;
    let flow = json!({"quota": "api", "mode": "enforce", "fallback": "local"});
    app.admin_json(Method::PUT, "/v1/flows/invoice", Some(flow))
        .await;
    let mut stream = ShareStream::connect(&app, "flow=invoice").await;
    let share = stream.next_share(Duration::from_secs(2)).await;
    assert_eq!(share["quotas"][0]["windows"][0]["left"], 100, "{share}");
    for _ in 0..3 {
        app.reserve(json!({"flow": "invoice"})).await;
    }
    let share = stream.next_share(Duration::from_millis(1_800)).await;
    assert_eq!(share["quotas"][0]["windows"][0]["left"], 97, "{share}");
    // An upstream 429 slows the cadence; the configured one is still told.
    let report = app
        .post("/v1/report")
        .json(&json!({"flow": "invoice", "status": 429}))
        .send()
        .await
        .unwrap();
    assert_eq!(report.status(), 200);
    let share = stream.next_share(Duration::from_millis(1_800)).await;
    let quota = &share["quotas"][0];
    assert!(quota["rate"].as_f64().unwrap() < 7.1, "{share}");
    assert_eq!(
        (&quota["configured_rate"], &quota["configured_burst"]),
        (&json!(10.0), &json!(5.0))
    );
}
