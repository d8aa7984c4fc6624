#![allow(dead_code)] // each test binary uses its part of the fake
//! A scripted stand-in for the arbiter's HTTP API: it answers each request with
//! the next scripted reply (the last one repeats) and records what it saw and
//! when, by tokio's clock, so tests on paused time read exact waits. The share
//! stream (`GET /v1/stream`) is apart: it sends the fake's share event, if it
//! has one (else a 404), and stays open; it takes no scripted reply and is
//! not among what the fake saw.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub enum Reply {
    Answer {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Value,
    },
    /// Read the request, never answer; wait for the client to hang up.
    Hang,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Reply::Answer {
            status,
            headers: Vec::new(),
            body,
        }
    }

    /// A problem+json with the arbiter's `type` for `slug`.
    pub fn problem(status: u16, slug: &str) -> Self {
        Self::json(
            status,
            json!({"type": format!("https://quota-arbiter.dev/problems/{slug}"),
                "title": slug, "status": status, "detail": format!("fake {slug}")}),
        )
    }

    pub fn retry_after(mut self, value: impl Into<String>) -> Self {
        if let Reply::Answer { headers, .. } = &mut self {
            headers.push(("retry-after", value.into()));
        }
        self
    }

    /// `Retry-After` as the HTTP-date `wait` from now (whole seconds).
    pub fn retry_after_date(self, wait: Duration) -> Self {
        self.retry_after(httpdate::fmt_http_date(SystemTime::now() + wait))
    }
}

pub fn granted(flow: &str) -> Reply {
    Reply::json(
        200,
        json!({"outcome": "granted", "flow": flow, "quota": "ppf", "mode": "enforce",
            "window_start": "2026-11-30T14:00:00Z", "retry_at": null, "retry_after_seconds": null,
            "would_defer": false, "limit": null, "lease_id": "42", "valid_until": null}),
    )
}

pub fn bypassed(flow: &str) -> Reply {
    Reply::json(
        200,
        json!({"outcome": "bypassed", "flow": flow, "quota": "ppf", "mode": "enforce",
            "window_start": "2026-11-30T14:00:00Z", "retry_at": null, "retry_after_seconds": null,
            "would_defer": false, "limit": null, "lease_id": null, "valid_until": null}),
    )
}

/// A deferral until `wait` from now (by the real clock, as the arbiter's
/// database clock would be), with the arbiter's whole seconds rounded up.
pub fn deferred(flow: &str, wait: Duration, limit: &str) -> Reply {
    let retry_at: DateTime<Utc> = Utc::now() + wait;
    Reply::json(
        200,
        json!({"outcome": "deferred", "flow": flow, "quota": "ppf", "mode": "enforce",
            "window_start": "2026-11-30T14:00:00Z", "retry_at": retry_at,
            "retry_after_seconds": wait.as_millis().div_ceil(1000), "would_defer": false,
            "limit": limit, "lease_id": null, "valid_until": null}),
    )
}

/// What the fake saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

struct Script {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
    in_flight: AtomicUsize,
    /// The share event, and when it was set: its windows' ends move on
    /// with the clock, as the arbiter's do.
    share: Mutex<Option<(Value, Instant)>>,
    streams: AtomicUsize,
}

pub struct FakeArbiter {
    pub url: String,
    script: Arc<Script>,
}

impl FakeArbiter {
    /// Listens on an address of its own: the client's process-wide gates are
    /// per arbiter URL, so tests running side by side never share one.
    pub async fn start(replies: impl IntoIterator<Item = Reply>) -> Self {
        let listener = TcpListener::bind((own_address(), 0)).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let script = Arc::new(Script {
            replies: Mutex::new(replies.into_iter().collect()),
            seen: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            share: Mutex::new(None),
            streams: AtomicUsize::new(0),
        });
        let serving = script.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, serving.clone()));
            }
        });
        Self { url, script }
    }

    /// Streams connecting from now on receive this `share` event's data,
    /// its windows as the arbiter would tell them then: each window's
    /// `ends_in_seconds` counts down from now, and a window that has ended
    /// gives way to the next, with its whole `ceiling` left (the fake
    /// counts nothing).
    pub fn share(&self, event: Value) {
        *self.script.share.lock().unwrap() = Some((event, Instant::now()));
    }

    /// Share streams connected so far.
    pub fn streams(&self) -> usize {
        self.script.streams.load(Ordering::SeqCst)
    }

    /// Replaces the script: the arbiter changes its mind (comes back).
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        *self.script.replies.lock().unwrap() = replies.into_iter().collect();
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.script.seen.lock().unwrap().clone()
    }

    /// Requests read and not yet answered nor abandoned by the client.
    pub fn in_flight(&self) -> usize {
        self.script.in_flight.load(Ordering::SeqCst)
    }

    /// The waits between consecutive requests.
    pub fn gaps(&self) -> Vec<Duration> {
        let seen = self.seen();
        seen.windows(2).map(|w| w[1].at - w[0].at).collect()
    }
}

/// 127.77.x.y: a loopback address no other test of the process uses.
fn own_address() -> std::net::Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    std::net::Ipv4Addr::new(127, 77, (n / 250) as u8, (n % 250 + 1) as u8)
}

/// One request per connection (every answer says `connection: close`).
async fn serve(mut stream: TcpStream, script: Arc<Script>) {
    let Some((head, body)) = read_request(&mut stream).await else {
        return;
    };
    let mut lines = head.lines();
    let path = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("")
        .to_string();
    let authorization = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        .map(|(_, value)| value.trim().to_string());
    if path.starts_with("/v1/stream") {
        return stream_shares(stream, &script).await;
    }
    let reply = {
        let mut replies = script.replies.lock().unwrap();
        let reply = if replies.len() > 1 {
            replies.pop_front()
        } else {
            replies.front().cloned()
        };
        reply.expect("a scripted reply")
    };
    script.seen.lock().unwrap().push(Seen {
        at: Instant::now(),
        path,
        authorization,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    script.in_flight.fetch_add(1, Ordering::SeqCst);
    match reply {
        Reply::Hang => {
            // Until the client hangs up.
            let mut rest = [0u8; 64];
            while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
        }
        Reply::Answer {
            status,
            headers,
            body,
        } => {
            let body = body.to_string();
            let mut response = format!(
                "HTTP/1.1 {status} Fake\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(&body);
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
    script.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// The share stream: the event, then open until the client hangs up.
async fn stream_shares(mut stream: TcpStream, script: &Script) {
    let share = script.share.lock().unwrap().clone();
    let share = share.map(|(event, set_at)| windows_now(event, set_at.elapsed()));
    let Some(share) = share else {
        let _ = stream
            .write_all(b"HTTP/1.1 404 Fake\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
        return;
    };
    script.streams.fetch_add(1, Ordering::SeqCst);
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n: hello\n\nevent: share\ndata: {share}\n\n"
    );
    if stream.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let mut rest = [0u8; 64];
    while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
}

/// `event` as it reads `elapsed` after it was set (see [`FakeArbiter::share`]),
/// a slowed cadence recovered meanwhile as the arbiter's adaptive factor
/// recovers (×1.005 a second, never above what is configured).
fn windows_now(mut event: Value, elapsed: Duration) -> Value {
    let recovery = quota_arbiter_client::recovered_factor;
    let elapsed_seconds = elapsed;
    let elapsed = elapsed.as_secs_f64();
    for quota in event
        .get_mut("quotas")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        for (now, configured) in [("rate", "configured_rate"), ("burst", "configured_burst")] {
            if let (Some(rate), Some(configured)) = (
                quota[now].as_f64(),
                quota.get(configured).and_then(Value::as_f64),
            ) {
                let factor = recovery(rate / configured, elapsed_seconds);
                quota[now] = (configured * factor).into();
            }
        }
    }
    let quotas = event.get_mut("quotas").and_then(Value::as_array_mut);
    let windows = quotas
        .into_iter()
        .flatten()
        .filter_map(|q| q.get_mut("windows"));
    for window in windows.filter_map(Value::as_array_mut).flatten() {
        let Some(mut ends_in) = window["ends_in_seconds"].as_f64() else {
            continue;
        };
        let seconds = window["seconds"].as_f64().unwrap_or(3600.0);
        ends_in -= elapsed;
        if ends_in <= 0.0 {
            while ends_in <= 0.0 {
                ends_in += seconds;
            }
            window["left"] = window["ceiling"].clone();
        }
        window["ends_in_seconds"] = ends_in.into();
    }
    event
}

async fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    Some((head, buffer[head_end..head_end + length].to_vec()))
}
