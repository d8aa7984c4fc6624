//! The client's subscription to the arbiter's share broadcast
//! (`GET /v1/stream`, design.md §10): one background connection per client,
//! following the flows it reserved for, remembering the last `share` event.
//! It reconnects with the client's backoff after any failure; the last event
//! received stands meanwhile, which is what the fallback decides by.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Url;
use tokio::task::AbortHandle;

use crate::gate::lock;
use crate::retry::RetryPolicy;
use crate::share::{ShareEvent, Shares};

/// Longest silence before a stream counts as dead: the arbiter sends a
/// keep-alive comment every 15 s.
const SILENCE_MAX: Duration = Duration::from_secs(45);

/// Where and how to connect.
pub struct StreamTarget {
    pub http: reqwest::Client,
    pub url: Url,
    pub key: Option<String>,
    pub retry: RetryPolicy,
}

impl StreamTarget {
    pub fn new(
        base: &Url,
        key: Option<String>,
        retry: RetryPolicy,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        // No overall timeout: the response never ends. A silent connection is
        // caught by the read timeout instead.
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(SILENCE_MAX)
            .build()
            .map_err(|why| why.to_string())?;
        let url = base.join("v1/stream").map_err(|why| why.to_string())?;
        Ok(Self {
            http,
            url,
            key,
            retry,
        })
    }
}

/// The flows followed and the task that follows them; dropping it (the
/// last clone of the client going) ends the connection.
pub struct Follower {
    target: Arc<StreamTarget>,
    pub shares: Arc<Shares>,
    state: Mutex<Following>,
}

#[derive(Default)]
struct Following {
    flows: BTreeSet<String>,
    task: Option<AbortHandle>,
}

impl Follower {
    pub fn new(target: StreamTarget) -> Self {
        Self {
            target: Arc::new(target),
            shares: Arc::default(),
            state: Mutex::default(),
        }
    }

    /// Follows `flow` too: the first time a flow is seen the stream
    /// reconnects with every flow followed so far.
    pub fn follow(&self, flow: &str) {
        let mut state = lock(&self.state);
        if state.flows.contains(flow) {
            return;
        }
        state.flows.insert(flow.to_string());
        if let Some(task) = state.task.take() {
            task.abort();
        }
        let flows: Vec<String> = state.flows.iter().cloned().collect();
        let task = tokio::spawn(follow(self.target.clone(), flows, self.shares.clone()));
        state.task = Some(task.abort_handle());
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.state).task.take() {
            task.abort();
        }
    }
}

/// Connects, reads `share` events into `shares`, reconnects after a backoff
/// when the connection fails or ends; forever, until aborted.
async fn follow(target: Arc<StreamTarget>, flows: Vec<String>, shares: Arc<Shares>) {
    let mut url = target.url.clone();
    {
        let mut query = url.query_pairs_mut();
        for flow in &flows {
            query.append_pair("flow", flow);
        }
    }
    let mut failures = 0;
    loop {
        match read_events(&target, &url, &shares).await {
            // At least one event came: the next failure starts the backoff over.
            Ok(true) => failures = 1,
            Ok(false) | Err(_) => failures += 1,
        }
        let wait = target.retry.wait_before_retry(failures, None);
        tracing::debug!(
            wait_ms = wait.as_millis() as u64,
            "share stream closed; reconnecting"
        );
        tokio::time::sleep(wait).await;
    }
}

/// One connection: whether it delivered an event before it ended.
async fn read_events(
    target: &StreamTarget,
    url: &Url,
    shares: &Shares,
) -> Result<bool, reqwest::Error> {
    let mut request = target.http.get(url.clone());
    if let Some(key) = &target.key {
        request = request.bearer_auth(key);
    }
    let mut response = request.send().await?.error_for_status()?;
    let mut frames = Frames::default();
    let mut delivered = false;
    while let Some(chunk) = response.chunk().await? {
        for (name, data) in frames.push(&String::from_utf8_lossy(&chunk)) {
            if name != "share" {
                continue;
            }
            match serde_json::from_str::<ShareEvent>(&data) {
                Ok(event) => {
                    shares.update(&event);
                    delivered = true;
                }
                Err(why) => tracing::warn!(%why, "share event not understood"),
            }
        }
    }
    Ok(delivered)
}

/// Server-sent events as they arrive in chunks: complete frames out, the
/// rest kept for the next chunk.
#[derive(Default)]
pub struct Frames {
    buffered: String,
}

impl Frames {
    /// The complete events so far: (event name, data lines joined by `\n`).
    /// Comments (keep-alives) and frames without data are skipped.
    pub fn push(&mut self, text: &str) -> Vec<(String, String)> {
        self.buffered.push_str(&text.replace("\r\n", "\n"));
        let mut events = Vec::new();
        while let Some(end) = self.buffered.find("\n\n") {
            let frame: String = self.buffered.drain(..end + 2).collect();
            let mut name = "message".to_string();
            let mut data: Vec<&str> = Vec::new();
            for line in frame.lines() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => name = value.to_string(),
                    "data" => data.push(value),
                    _ => {}
                }
            }
            if !data.is_empty() {
                events.push((name, data.join("\n")));
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_across_chunks_and_comments_skipped() {
        let mut frames = Frames::default();
        assert!(frames.push(": keep-alive\n\nevent: sha").is_empty());
        assert_eq!(
            frames.push("re\ndata: {\"quotas\":\r\ndata: []}\n\nevent: other\ndata: x\n\n"),
            [
                ("share".to_string(), "{\"quotas\":\n[]}".to_string()),
                ("other".to_string(), "x".to_string())
            ]
        );
        assert!(frames.push("data: partial").is_empty());
    }
}
