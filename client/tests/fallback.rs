//! The local fallback against a scripted fake arbiter, on paused time: it
//! decides at the share once the arbiter is unreachable, waits rather than
//! refuses, adapts to reported statuses, and hands its slots to the arbiter
//! once it answers again.

mod fake;

use std::time::Duration;

use quota_arbiter_client::{Client, Decision, Error, Report, Reserve, RetryPolicy};
use serde_json::{json, Value};
use tokio::time::{sleep, Instant};

use fake::{granted, FakeArbiter, Reply};

const S: fn(u64) -> Duration = Duration::from_secs;

/// Quota `ppf` at 30/s (burst 3) among 3 clients: this one's share is 10/s,
/// burst 1. `invoice` opted in, `sync` did not.
/// The arbiter's bypass horizon: 15 minutes.
fn share_event() -> Value {
    json!({"quotas": [{"quota": "ppf", "rate": 30.0, "burst": 3.0, "hourly_ceiling": 1000000,
        "clients": 3, "flows": [{"flow": "invoice", "fallback": "local"},
        {"flow": "sync", "fallback": "off"}]}], "bypass_horizon_seconds": 900.0})
}

fn unavailable() -> Reply {
    Reply::problem(503, "store-unavailable")
}

/// Two attempts 1 s apart; probes of a fallen arbiter up to 8 s apart.
fn quick_client(arbiter: &FakeArbiter) -> Client {
    Client::builder()
        .url(&arbiter.url)
        .retry(RetryPolicy {
            attempts: 2,
            base: S(1),
            max: S(8),
        })
        .build()
        .unwrap()
}

/// A client of a fake that granted its first calls and is unreachable
/// since: its share known from the stream its first reservation opened.
async fn client_of_a_fallen_arbiter() -> (FakeArbiter, Client) {
    let arbiter = FakeArbiter::start([granted("invoice"), granted("sync"), unavailable()]).await;
    arbiter.share(share_event());
    let client = quick_client(&arbiter);
    for flow in ["invoice", "sync"] {
        let decision = client.reserve(Reserve::new(flow)).await.unwrap();
        assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    }
    let start = Instant::now();
    while client.share("invoice").is_none() || client.share("sync").is_none() {
        assert!(
            start.elapsed() < S(5),
            "the share stream delivered no share"
        );
        sleep(Duration::from_millis(10)).await;
    }
    (arbiter, client)
}

/// Acquires `invoice` for `span`: each decision's time since the first one.
async fn degraded_for(client: &Client, span: Duration) -> Vec<Duration> {
    let mut at = Vec::new();
    let mut start = None;
    loop {
        let decision = client.acquire(Reserve::new("invoice")).await.unwrap();
        assert!(
            matches!(decision, Decision::Degraded { count: 1, ref quota, .. } if quota == "ppf"),
            "{decision:?}"
        );
        let start = *start.get_or_insert_with(Instant::now);
        if start.elapsed() > span {
            return at;
        }
        at.push(start.elapsed());
    }
}

/// The arbiter answers reports again: the reports the client sent until it
/// had none left.
async fn reports_once_back(arbiter: &FakeArbiter, client: &Client) -> Vec<Value> {
    let back = arbiter.seen().len();
    arbiter.script([Reply::json(200, json!({"released": null, "counted": 1}))]);
    assert_eq!(client.settle_degraded(S(30)).await, 0, "slots unreported");
    arbiter.seen()[back..]
        .iter()
        .filter(|seen| seen.path == "/v1/report")
        .map(|seen| seen.body.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_arbiter_leaves_flows_that_opted_in_to_their_share() {
    let (arbiter, client) = client_of_a_fallen_arbiter().await;
    let share = client.share("invoice").unwrap();
    assert_eq!(
        (share.limits.rate, share.limits.burst, share.clients),
        (10.0, 1.0, 3)
    );

    // A flow without fallback fails as before.
    let error = client.reserve(Reserve::new("sync")).await.unwrap_err();
    assert!(error.arbiter_unreachable(), "{error}");

    // 10/s with a burst of 1: over 10 s the burst and one per 100 ms,
    // waited for, never refused.
    let at = degraded_for(&client, S(10)).await;
    assert_eq!(at.len(), 101, "{at:?}");
    assert!(
        at.windows(2)
            .all(|w| w[1] - w[0] >= Duration::from_millis(99)),
        "{at:?}"
    );
    assert_eq!(client.unreported("invoice"), 102);
    // The arbiter is asked now and then (a probe, with the backoff), not
    // once per decision.
    let asked = arbiter
        .seen()
        .iter()
        .filter(|seen| seen.path == "/v1/reserve")
        .count();
    assert!(asked < 12, "{asked} reservations asked of a fallen arbiter");
}

#[tokio::test(start_paused = true)]
async fn reported_statuses_adapt_the_local_bucket_and_recover() {
    let (arbiter, client) = client_of_a_fallen_arbiter().await;
    degraded_for(&client, S(1)).await;
    let before = arbiter.seen().len();

    let answer = client
        .report(&Report::flow("invoice").status(429))
        .await
        .unwrap();
    assert!(answer.local, "{answer:?}");
    assert!(
        (answer.effective_rate.unwrap() - 7.0).abs() < 0.01,
        "{answer:?}"
    );
    let answer = client
        .report(&Report::flow("invoice").timed_out())
        .await
        .unwrap();
    assert!(
        (answer.effective_rate.unwrap() - 5.6).abs() < 0.01,
        "{answer:?}"
    );
    // Not sent: the arbiter is unreachable.
    assert_eq!(
        arbiter
            .seen()
            .iter()
            .skip(before)
            .filter(|seen| seen.path == "/v1/report" && seen.body.get("status").is_some())
            .count(),
        0
    );
    // 5.6/s now: over 5 s, 28 (± the recovery meanwhile).
    let at = degraded_for(&client, S(5)).await;
    assert!((28..=30).contains(&at.len()), "{} in 5 s", at.len());

    // Quiet for long: back at the share, never above it.
    sleep(S(600)).await;
    let answer = client
        .report(&Report::flow("invoice").status(200))
        .await
        .unwrap();
    assert_eq!(
        (answer.effective_rate, answer.effective_burst),
        (Some(10.0), Some(1.0))
    );
}

#[tokio::test(start_paused = true)]
async fn degraded_slots_reach_the_arbiter_once_it_answers_again() {
    let (arbiter, client) = client_of_a_fallen_arbiter().await;
    let decided = degraded_for(&client, S(2)).await.len() as u64 + 1;
    assert_eq!(client.unreported("invoice"), decided);

    // Back: reports are answered, reservations granted.
    let reported = reports_once_back(&arbiter, &client).await;
    // All of them, once.
    assert_eq!(
        reported,
        [json!({"flow": "invoice", "degraded": decided})],
        "{reported:?}"
    );
    // And the next reservation goes to the arbiter again (its probe is due
    // within the backoff's cap).
    arbiter.script([granted("invoice")]);
    sleep(S(8)).await;
    let decision = client.reserve(Reserve::new("invoice")).await.unwrap();
    assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    let decision = client.reserve(Reserve::new("invoice")).await.unwrap();
    assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
}

#[tokio::test(start_paused = true)]
async fn due_work_is_let_through_at_once_and_reported_as_bypassed() {
    let (arbiter, client) = client_of_a_fallen_arbiter().await;
    // The bucket emptied by work that can wait.
    degraded_for(&client, S(1)).await;

    // Due in 10 minutes, within the horizon: no wait, however empty the bucket.
    let due = Reserve::new("invoice")
        .count(2)
        .deadline(chrono::Utc::now() + chrono::Duration::minutes(10));
    let start = Instant::now();
    for _ in 0..5 {
        let decision = client.reserve(&due).await.unwrap();
        assert!(
            matches!(
                decision,
                Decision::Degraded {
                    count: 2,
                    bypassed: true,
                    ..
                }
            ),
            "{decision:?}"
        );
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "due work waited");

    // Due in an hour: it waits like the rest, behind the debt the due work
    // left (10 tokens at 10/s).
    let later = Reserve::new("invoice").deadline(chrono::Utc::now() + chrono::Duration::hours(1));
    let decision = client.reserve(&later).await.unwrap();
    assert!(
        matches!(
            decision,
            Decision::Degraded {
                bypassed: false,
                ..
            }
        ),
        "{decision:?}"
    );
    assert!(start.elapsed() >= S(1), "waited {:?}", start.elapsed());

    // Back: the report says which decisions were bypasses.
    let unreported = client.unreported("invoice");
    let reported = reports_once_back(&arbiter, &client).await;
    assert_eq!(
        reported,
        [json!({"flow": "invoice", "degraded": unreported, "bypassed": 5})]
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_known_share_nothing_falls_back() {
    // No share event: the stream is refused (404), the share stays unknown.
    let arbiter = FakeArbiter::start([unavailable()]).await;
    let client = quick_client(&arbiter);
    let error = client.reserve(Reserve::new("invoice")).await.unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert_eq!(client.share("invoice"), None);
    assert_eq!(arbiter.streams(), 0);
}

/// A client of a fake arbiter that granted its first call (opening the
/// share stream, which sends `event`) and is unreachable since.
async fn fallen_with_share(arbiter: &FakeArbiter) -> Client {
    let client = quick_client(arbiter);
    let decision = client.reserve(Reserve::new("invoice")).await.unwrap();
    assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    let start = Instant::now();
    while client.share("invoice").is_none() {
        assert!(start.elapsed() < S(5), "no share");
        sleep(Duration::from_millis(10)).await;
    }
    client
}

/// Decisions of `invoice` that `client` makes locally within `span`, each
/// ask given up after `span` (a wait for the next window is no decision).
async fn local_decisions(client: &Client, span: Duration) -> usize {
    let until = Instant::now() + span;
    let mut decided = 0;
    while Instant::now() < until {
        let left = until - Instant::now();
        match tokio::time::timeout(left, client.reserve(Reserve::new("invoice"))).await {
            Ok(Ok(Decision::Degraded { .. })) => decided += 1,
            Ok(other) => panic!("{other:?}"),
            Err(_) => break,
        }
    }
    decided
}

/// Many clients on a small ceiling (design.md §13): 10 an hour among 20
/// live clients is half a slot each, so none decides anything locally (it
/// says the arbiter is unreachable), however long the outage; due work
/// still goes at once. Among 4, each spends its 2 of the 10, then 2 of the
/// next hour's: together never more than the window had.
#[tokio::test(start_paused = true)]
async fn many_clients_on_a_small_ceiling_never_spend_more_than_it_together() {
    let hour = |clients: i64| {
        json!({"quotas": [{"quota": "ppf", "rate": null, "burst": null, "hourly_ceiling": 10,
            "windows": [{"period": "1h", "ceiling": 10, "seconds": 3600, "left": 10,
                         "ends_in_seconds": 1800.0}],
            "clients": clients, "flows": [{"flow": "invoice", "fallback": "local"}]}],
            "bypass_horizon_seconds": 900.0})
    };
    let arbiter = FakeArbiter::start([granted("invoice"), unavailable()]).await;
    arbiter.share(hour(20));
    let crowd = fallen_with_share(&arbiter).await;
    let error = crowd.reserve(Reserve::new("invoice")).await.unwrap_err();
    assert!(error.arbiter_unreachable(), "{error}");
    let due = Reserve::new("invoice").deadline(chrono::Utc::now() + chrono::Duration::minutes(1));
    let decision = crowd.reserve(&due).await.unwrap();
    assert!(
        matches!(decision, Decision::Degraded { bypassed: true, .. }),
        "{decision:?}"
    );

    // Four processes, each its own client of the quota (a fake each: a
    // process's clients of one arbiter share their stream).
    let mut spent = 0;
    for _ in 0..4 {
        let arbiter = FakeArbiter::start([granted("invoice"), unavailable()]).await;
        arbiter.share(hour(4));
        let client = fallen_with_share(&arbiter).await;
        spent += local_decisions(&client, S(1800 + 3600)).await;
    }
    assert_eq!(spent, 4 * (2 + 2), "2.5 each of 10, this hour and the next");
}

/// An outage late in a window that was mostly spent: two clients, the hour
/// with 100 of 1000 left and 10 minutes to go. Each spends its 50 until the
/// hour ends (its pace alone would allow 83), then its 500 of the next.
#[tokio::test(start_paused = true)]
async fn an_outage_late_in_a_spent_window_spends_only_what_it_had_left() {
    let arbiter = FakeArbiter::start([granted("invoice"), unavailable()]).await;
    arbiter.share(
        json!({"quotas": [{"quota": "ppf", "rate": null, "burst": null,
        "hourly_ceiling": 1000,
        "windows": [{"period": "1h", "ceiling": 1000, "seconds": 3600, "left": 100,
                     "ends_in_seconds": 600.0}],
        "clients": 2, "flows": [{"flow": "invoice", "fallback": "local"}]}],
        "bypass_horizon_seconds": 900.0}),
    );
    let client = fallen_with_share(&arbiter).await;
    assert_eq!(local_decisions(&client, S(599)).await, 50);
    sleep(S(2)).await;
    // The next hour: its 500, at 1000/3600/2 a second, spread over it.
    let next = local_decisions(&client, S(3598)).await;
    assert!((498..=500).contains(&next), "{next}");
}

/// An outage after a 429 episode: the arbiter had slowed the quota to a
/// fifth of its configured cadence. The local rate starts there and
/// recovers toward the configured share, not the throttled one.
#[tokio::test(start_paused = true)]
async fn after_a_slow_down_the_local_rate_recovers_toward_the_configured_share() {
    let arbiter = FakeArbiter::start([granted("invoice"), unavailable()]).await;
    arbiter.share(
        json!({"quotas": [{"quota": "ppf", "rate": 2.0, "burst": 1.0,
        "configured_rate": 10.0, "configured_burst": 1.0, "hourly_ceiling": 1000000,
        "clients": 1, "flows": [{"flow": "invoice", "fallback": "local"}]}],
        "bypass_horizon_seconds": 900.0}),
    );
    let client = fallen_with_share(&arbiter).await;
    let early = local_decisions(&client, S(10)).await;
    assert!((18..=24).contains(&early), "about 2/s at first: {early}");
    sleep(S(400)).await;
    let late = local_decisions(&client, S(10)).await;
    assert!((98..=102).contains(&late), "back at 10/s: {late}");
}
