//! The client against a scripted fake arbiter, on paused time: every wait is
//! exact and costs no real time.

mod fake;

use std::time::Duration;

use chrono::Utc;
use quota_arbiter_client::{Client, Decision, Error, Failure, Reserve, RetryPolicy};
use serde_json::json;
use tokio::time::Instant;

use fake::{bypassed, deferred, granted, FakeArbiter, Reply};

const S: fn(u64) -> Duration = Duration::from_secs;

fn client(arbiter: &FakeArbiter) -> Client {
    Client::builder().url(&arbiter.url).build().unwrap()
}

fn capped(attempts: u32, base: u64, max: u64) -> RetryPolicy {
    RetryPolicy {
        attempts,
        base: S(base),
        max: S(max),
    }
}

/// Reserves once from a fake answering `failures`, then granting, with
/// `retry`; returns the fake for the waits between its requests.
async fn granted_after(failures: Vec<Reply>, retry: RetryPolicy) -> FakeArbiter {
    let mut replies = failures;
    replies.push(granted("invoice"));
    let arbiter = FakeArbiter::start(replies).await;
    let arbiter_client = Client::builder()
        .url(&arbiter.url)
        .retry(retry)
        .build()
        .unwrap();
    let decision = arbiter_client.reserve(Reserve::new("invoice")).await;
    assert!(
        matches!(decision, Ok(Decision::Granted { .. })),
        "{decision:?}"
    );
    arbiter
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_seconds_is_waited_then_granted() {
    let too_many = Reply::problem(429, "too-many").retry_after("3");
    let arbiter = granted_after(vec![too_many], RetryPolicy::default()).await;
    // 3 s, not the 2 s backoff: the longer Retry-After wins.
    assert_eq!(arbiter.gaps(), [S(3)]);
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_as_an_http_date_is_waited_then_granted() {
    let too_many = Reply::problem(429, "too-many").retry_after_date(S(10));
    let arbiter = granted_after(vec![too_many], RetryPolicy::default()).await;
    // The date has whole seconds: 9-10 s from when it was written.
    let gap = arbiter.gaps()[0];
    assert!(gap > S(9) && gap <= S(10), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn unavailability_without_retry_after_backs_off_2_4_8_capped() {
    let unavailable = vec![Reply::problem(503, "store-unavailable"); 5];
    let arbiter = granted_after(unavailable, capped(7, 2, 10)).await;
    assert_eq!(arbiter.gaps(), [2, 4, 8, 10, 10].map(S));
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_cap_is_still_honoured() {
    let unavailable = Reply::problem(503, "store-unavailable").retry_after("300");
    let arbiter = granted_after(vec![unavailable], capped(7, 2, 10)).await;
    assert_eq!(arbiter.gaps(), [S(300)]);
}

#[tokio::test(start_paused = true)]
async fn attempts_exhausted_is_an_error_saying_unavailable() {
    // The arbiter's own 503: problem+json and Retry-After: 2.
    let arbiter =
        FakeArbiter::start([Reply::problem(503, "store-unavailable").retry_after("2")]).await;
    let error = client(&arbiter)
        .reserve(Reserve::new("invoice"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("unavailable after 7 attempts"),
        "{error}"
    );
    assert!(error.arbiter_unreachable());
    // The defaults: 7 attempts in all, 2 s doubling; a shorter Retry-After loses.
    assert_eq!(arbiter.gaps(), [2, 4, 8, 16, 32, 64].map(S));
}

#[tokio::test(start_paused = true)]
async fn connection_errors_are_retried_then_unavailable() {
    // An address nothing listens on once the listener is gone.
    let url = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let arbiter_client = Client::builder()
        .url(url)
        .retry(capped(3, 1, 60))
        .build()
        .unwrap();
    let start = Instant::now();
    let error = arbiter_client
        .reserve(Reserve::new("invoice"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Unavailable {
                attempts: 3,
                last: Failure::Connect(_)
            }
        ),
        "{error:?}"
    );
    assert!(error.arbiter_unreachable());
    assert_eq!(start.elapsed(), S(1 + 2));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_is_retried_and_abandons_the_hung_request() {
    let arbiter = FakeArbiter::start([Reply::Hang, granted("invoice")]).await;
    let arbiter_client = Client::builder()
        .url(&arbiter.url)
        .timeout(S(5))
        .build()
        .unwrap();
    let decision = arbiter_client.reserve(Reserve::new("invoice")).await;
    assert!(
        matches!(decision, Ok(Decision::Granted { .. })),
        "{decision:?}"
    );
    // The 5 s timeout, then the 2 s backoff.
    assert_eq!(arbiter.gaps(), [S(7)]);
    wait_for_no_request_in_flight(&arbiter).await;
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_not_retried() {
    let arbiter = FakeArbiter::start([Reply::problem(422, "invalid-request")]).await;
    let error = client(&arbiter)
        .reserve(Reserve::new("invoice").count(20_000))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Refused { status: 422, problem: Some(p), .. } if p == "invalid-request"),
        "{error:?}"
    );
    assert_eq!(arbiter.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn sixteen_tasks_share_one_cooldown() {
    let arbiter = FakeArbiter::start([
        Reply::problem(429, "too-many").retry_after("30"),
        granted("invoice"),
    ])
    .await;
    let first_client = client(&arbiter);
    let first = tokio::spawn({
        let first_client = first_client.clone();
        async move { first_client.reserve(Reserve::new("invoice")).await }
    });
    // Idle time only advances once the first call has read its 429 and sleeps.
    tokio::time::sleep(S(1)).await;
    assert_eq!(arbiter.seen().len(), 1);
    // Clones and clients built apart: one gate per process and arbiter.
    let others: Vec<_> = (0..15)
        .map(|i| {
            let arbiter_client = if i % 2 == 0 {
                first_client.clone()
            } else {
                client(&arbiter)
            };
            tokio::spawn(async move { arbiter_client.reserve(Reserve::new("invoice")).await })
        })
        .collect();
    let mut decisions = vec![first.await.unwrap()];
    for task in others {
        decisions.push(task.await.unwrap());
    }
    assert!(decisions
        .iter()
        .all(|d| matches!(d, Ok(Decision::Granted { .. }))));
    let seen = arbiter.seen();
    assert_eq!(seen.len(), 17, "each task once, the first twice");
    let cooldown_end = seen[0].at + S(30);
    let during: Vec<_> = seen.iter().filter(|s| s.at < cooldown_end).collect();
    assert_eq!(
        during.len(),
        1,
        "one request reached the arbiter during the cooldown"
    );
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_through_deferrals_until_granted() {
    let arbiter = FakeArbiter::start([
        deferred("invoice", S(30), "budget"),
        deferred("invoice", Duration::from_millis(1_500), "cadence"),
        granted("invoice"),
    ])
    .await;
    let decision = client(&arbiter)
        .acquire(Reserve::new("invoice").reference("inv-42"))
        .await
        .unwrap();
    assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    let gaps = arbiter.gaps();
    // retry_at by the real clock, read a moment after it was written.
    assert!(gaps[0] > S(29) && gaps[0] <= S(30), "{gaps:?}");
    assert!(
        gaps[1] > Duration::from_millis(1_400) && gaps[1] <= Duration::from_millis(1_500),
        "{gaps:?}"
    );
    assert_eq!(gaps.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn acquire_asks_again_at_the_deadline_at_the_latest() {
    let arbiter =
        FakeArbiter::start([deferred("invoice", S(3_600), "budget"), bypassed("invoice")]).await;
    let deadline = Utc::now() + chrono::Duration::seconds(60);
    let decision = client(&arbiter)
        .acquire(Reserve::new("invoice").deadline(deadline))
        .await
        .unwrap();
    assert!(
        matches!(decision, Decision::Bypassed { .. }),
        "{decision:?}"
    );
    let gap = arbiter.gaps()[0];
    assert!(gap > S(59) && gap <= S(60), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn acquire_backs_off_deferrals_whose_retry_at_has_passed() {
    let mut replies = vec![deferred("invoice", Duration::ZERO, "in_flight"); 4];
    replies.push(granted("invoice"));
    let arbiter = FakeArbiter::start(replies).await;
    let decision = client(&arbiter)
        .acquire(Reserve::new("invoice"))
        .await
        .unwrap();
    assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    assert_eq!(
        arbiter.gaps(),
        [50, 100, 200, 400].map(Duration::from_millis)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_asks_nothing_more() {
    let arbiter = FakeArbiter::start([deferred("invoice", S(30), "budget")]).await;
    let arbiter_client = client(&arbiter);
    let cancelled =
        tokio::time::timeout(S(10), arbiter_client.acquire(Reserve::new("invoice"))).await;
    assert!(cancelled.is_err(), "still deferred at 10 s");
    tokio::time::sleep(S(600)).await;
    assert_eq!(arbiter.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_leaves_no_request_in_flight() {
    let arbiter = FakeArbiter::start([Reply::Hang]).await;
    let arbiter_client = client(&arbiter);
    let cancelled =
        tokio::time::timeout(S(1), arbiter_client.acquire(Reserve::new("invoice"))).await;
    assert!(cancelled.is_err(), "the fake never answers");
    assert_eq!(arbiter.seen().len(), 1);
    wait_for_no_request_in_flight(&arbiter).await;
    tokio::time::sleep(S(600)).await;
    assert_eq!(arbiter.seen().len(), 1, "no retry after the cancellation");
}

#[tokio::test(start_paused = true)]
async fn reserve_and_report_send_what_the_arbiter_reads_with_the_key() {
    let arbiter = FakeArbiter::start([
        granted("invoice"),
        Reply::json(
            200,
            json!({"released": true, "held_seconds": 0.8, "factor": 1.0}),
        ),
    ])
    .await;
    let arbiter_client = Client::builder()
        .url(&arbiter.url)
        .key("worker-key")
        .build()
        .unwrap();
    let decision = arbiter_client
        .reserve(Reserve::new("invoice").count(3).reference("inv-42"))
        .await
        .unwrap();
    let answer = arbiter_client
        .report(
            &decision
                .report()
                .status(200)
                .duration(Duration::from_millis(812)),
        )
        .await
        .unwrap();
    assert_eq!(answer.released, Some(true));
    let seen = arbiter.seen();
    assert_eq!(
        (seen[0].path.as_str(), &seen[0].body),
        (
            "/v1/reserve",
            &json!({"flow": "invoice", "count": 3, "ref": "inv-42"})
        )
    );
    assert_eq!(
        (seen[1].path.as_str(), &seen[1].body),
        (
            "/v1/report",
            &json!({"flow": "invoice", "lease_id": "42", "status": 200, "duration_ms": 812})
        )
    );
    assert!(seen
        .iter()
        .all(|s| s.authorization.as_deref() == Some("Bearer worker-key")));
}

#[tokio::test(start_paused = true)]
async fn local_pacing_spaces_requests_after_the_burst() {
    let arbiter = FakeArbiter::start([granted("invoice")]).await;
    let arbiter_client = Client::builder()
        .url(&arbiter.url)
        .pacing(4.0, 2)
        .build()
        .unwrap();
    for _ in 0..4 {
        arbiter_client
            .reserve(Reserve::new("invoice"))
            .await
            .unwrap();
    }
    let gaps = arbiter.gaps();
    assert_eq!(
        gaps,
        [0, 250, 250].map(Duration::from_millis),
        "a burst of 2, then 4/s"
    );
}

async fn wait_for_no_request_in_flight(arbiter: &FakeArbiter) {
    for _ in 0..100 {
        if arbiter.in_flight() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the fake still holds a request the client abandoned");
}
