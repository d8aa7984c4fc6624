//! `GET /v1/stream`: each connected worker's share of the quotas its flows
//! spend, as server-sent events (design.md §10).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, Problem};
use super::AppState;
use crate::domain::FlowName;
use crate::reservations::SharePresence;
use crate::store::{QuotaShare, ShareWindow};

/// How often a stream renews its presence and reads the shares: a change
/// reaches connected clients within about this.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// Most flows one stream may follow.
pub(super) const MAX_FLOWS: usize = 64;

/// The `share` event: sent on connect and whenever a value changes.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ShareEvent {
    /// The quotas the stream's flows spend (unknown flows spend none).
    pub(crate) quotas: Vec<QuotaShare>,
    /// The arbiter's bypass horizon: while it is unreachable, a client's local
    /// fallback lets work due within it through at once, as the arbiter would
    /// (design.md §12).
    #[schema(minimum = 0)]
    pub(crate) bypass_horizon_seconds: f64,
}

/// One frame as the SSE wire carries it: the event's name, and its data, a
/// [`ShareEvent`] written as JSON.
pub(crate) struct ShareFrame;

impl utoipa::PartialSchema for ShareFrame {
    fn schema() -> RefOr<Schema> {
        let name = ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .enum_values(Some(["share"]));
        let data = ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .content_media_type("application/json")
            .description(Some(
                r#"A ShareEvent: {"quotas": [{"quota", "rate", "burst", "hourly_ceiling", "windows": [{"period", "ceiling", "seconds"}], "clients", "flows": [{"flow", "fallback"}]}], "bypass_horizon_seconds"}"#,
            ));
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::Object))
            .property("event", name)
            .required("event")
            .property("data", data)
            .required("data")
            .into()
    }
}

impl ToSchema for ShareFrame {}

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stream))
}

/// Follow the shares of the quotas some flows spend: an `share` event (JSON
/// data) on connect and on every change of a rate, a burst or the number of
/// live clients; a comment every 15 s keeps idle connections open.
#[utoipa::path(
    get, path = "/v1/stream", tag = "reserve",
    params(("flow" = Vec<String>, Query, description = "The flows this client reserves for; repeat it: ?flow=a&flow=b")),
    responses(
        (status = 200, description = "Server-sent events named `share`", body = ShareFrame, content_type = "text/event-stream"),
        (status = 422, description = "No flow, or an invalid name", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn stream(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let flows = flows_of(query.as_deref().unwrap_or("")).map_err(ApiError::Invalid)?;
    let (events, received) = mpsc::channel(4);
    tokio::spawn(broadcast(
        state.reservations.share_presence(flows),
        state.bypass.horizon_seconds(),
        events,
        state.stopping.clone(),
    ));
    let events = ReceiverStream::<Result<Event, Infallible>>::new(received);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn flows_of(query: &str) -> Result<Vec<FlowName>, String> {
    let mut flows: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == "flow")
        .map(|(_, flow)| flow.into_owned())
        .collect();
    // Counted as given, as the document's maxItems counts them.
    if flows.is_empty() || flows.len() > MAX_FLOWS {
        return Err(format!("give 1 to {MAX_FLOWS} flows: ?flow=a&flow=b"));
    }
    flows.sort();
    flows.dedup();
    flows
        .into_iter()
        .map(|flow| FlowName::parse(flow.as_str()).map_err(|why| format!("flow `{flow}`: {why}")))
        .collect()
}

/// One connected client: its heartbeat and its events, until it goes.
async fn broadcast(
    mut presence: SharePresence,
    bypass_horizon_seconds: f64,
    events: mpsc::Sender<Result<Event, Infallible>>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut sent: Option<Vec<QuotaShare>> = None;
    let mut beat = tokio::time::interval(BEAT_EVERY);
    loop {
        // The replica stopping ends the stream: its client reconnects to
        // another replica (a stream never ends by itself otherwise).
        if *stopping.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = events.closed() => break,
            _ = stopping.changed() => break,
            _ = beat.tick() => {}
        }
        let shares = match presence.beat().await {
            Ok(shares) => shares,
            // The last event stands; the next beat tries again.
            Err(error) => {
                tracing::debug!(%error, "share stream: store unavailable");
                continue;
            }
        };
        if !worth_sending(sent.as_deref(), &shares) {
            continue;
        }
        let event = ShareEvent {
            quotas: shares,
            bypass_horizon_seconds,
        };
        let Ok(frame) = Event::default().event("share").json_data(&event) else {
            break;
        };
        if events.send(Ok(frame)).await.is_err() {
            break;
        }
        sent = Some(event.quotas);
    }
    presence.leave().await;
}

/// How far an effective rate or burst, or what a window has left (as a
/// part of its ceiling), may move before the clients hear of it: the
/// adaptive factor recovers continuously, and a 0.1 % step every second is
/// no news to a client deciding at its share.
const SHARE_TOLERANCE: f64 = 0.01;

/// Whether `now` is news against what was `sent` last: anything but the
/// effective rate and burst and the windows' `left` changed (a window that
/// rolled over, a client more), or one of those moved by more than
/// [`SHARE_TOLERANCE`] (a window's `left`: of its ceiling, and any move to
/// or from nothing left), so a slow drift is sent once it adds up.
/// `ends_in_seconds` shrinks every beat and is no news: `ends_at` is.
fn worth_sending(sent: Option<&[QuotaShare]>, now: &[QuotaShare]) -> bool {
    let Some(sent) = sent else {
        return true;
    };
    let moved = |was: Option<f64>, is: Option<f64>| match (was, is) {
        (Some(was), Some(is)) => (is - was).abs() > SHARE_TOLERANCE * was.abs(),
        (was, is) => was.is_some() != is.is_some(),
    };
    let left_moved = |was: &ShareWindow, is: &ShareWindow| {
        let step = (is.left - was.left).abs() as f64;
        (was.left == 0) != (is.left == 0) || step > SHARE_TOLERANCE * was.ceiling as f64
    };
    // What is compared exactly: the rest.
    let fixed = |share: &QuotaShare| QuotaShare {
        rate: None,
        burst: None,
        windows: share
            .windows
            .iter()
            .map(|w| ShareWindow {
                left: 0,
                ends_in_seconds: 0.0,
                ..w.clone()
            })
            .collect(),
        ..share.clone()
    };
    sent.len() != now.len()
        || sent.iter().zip(now).any(|(was, is)| {
            moved(was.rate, is.rate)
                || moved(was.burst, is.burst)
                || fixed(was) != fixed(is)
                || was
                    .windows
                    .iter()
                    .zip(&is.windows)
                    .any(|(w, i)| left_moved(w, i))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(rate: Option<f64>, clients: i64) -> QuotaShare {
        QuotaShare {
            quota: "api".into(),
            rate,
            burst: rate.map(|r| r / 2.0),
            // The cadence as configured stays put while the one in force moves.
            configured_rate: Some(10.0),
            configured_burst: Some(5.0),
            hourly_ceiling: Some(1000),
            windows: vec![hour(1000, 0)],
            clients,
            flows: Vec::new(),
        }
    }

    /// The hour with `left` slots, ending `hour` hours after the epoch's.
    fn hour(left: i64, hour: i64) -> ShareWindow {
        ShareWindow {
            period: "1h".into(),
            ceiling: 1000,
            seconds: 3600,
            left,
            ends_at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH + chrono::Duration::hours(hour),
            ends_in_seconds: 1800.0,
        }
    }

    fn with_window(window: ShareWindow) -> QuotaShare {
        QuotaShare {
            windows: vec![window],
            ..share(Some(10.0), 1)
        }
    }

    #[test]
    fn what_a_window_has_left_is_sent_when_it_moves_by_more_than_a_percent_of_its_ceiling() {
        let sent = [with_window(hour(500, 1))];
        let ticking = ShareWindow {
            ends_in_seconds: 1.0,
            ..hour(495, 1)
        };
        assert!(
            !worth_sending(Some(&sent), &[with_window(ticking)]),
            "5 of 1000, the clock"
        );
        assert!(
            worth_sending(Some(&sent), &[with_window(hour(489, 1))]),
            "11 of 1000"
        );
        assert!(
            worth_sending(Some(&sent), &[with_window(hour(500, 2))]),
            "the next hour"
        );
        let nearly_spent = [with_window(hour(3, 1))];
        assert!(
            worth_sending(Some(&nearly_spent), &[with_window(hour(0, 1))]),
            "spent"
        );
    }

    #[test]
    fn a_share_is_sent_when_it_moves_by_more_than_a_percent_or_anything_else_changes() {
        let sent = [share(Some(10.0), 1)];
        assert!(worth_sending(None, &sent), "the first event");
        assert!(!worth_sending(Some(&sent), &sent));
        assert!(
            !worth_sending(Some(&sent), &[share(Some(10.09), 1)]),
            "0.9 %"
        );
        assert!(
            worth_sending(Some(&sent), &[share(Some(10.11), 1)]),
            "1.1 %"
        );
        assert!(
            worth_sending(Some(&sent), &[share(Some(9.8), 1)]),
            "down 2 %"
        );
        assert!(
            worth_sending(Some(&sent), &[share(None, 1)]),
            "the cadence gone"
        );
        assert!(
            worth_sending(Some(&sent), &[share(Some(10.0), 2)]),
            "a client more"
        );
        assert!(worth_sending(Some(&sent), &[]), "the quota gone");
    }

    #[test]
    fn flows_are_the_repeated_flow_parameter() {
        assert_eq!(
            flows_of("flow=b&flow=a&other=x&flow=b").unwrap(),
            ["a", "b"]
        );
        assert_eq!(flows_of("flow=team%2Finvoice").unwrap(), ["team/invoice"]);
        assert!(flows_of("").is_err());
        assert!(flows_of("flow=bad%20name").is_err());
    }

    /// As many as the document's maxItems, counted as given (repeats too).
    #[test]
    fn at_most_max_flows_are_given() {
        let given = |n: usize| vec!["flow=f"; n].join("&");
        assert_eq!(flows_of(&given(MAX_FLOWS)).unwrap(), ["f"]);
        assert!(flows_of(&given(MAX_FLOWS + 1)).is_err());
        assert!(flows_of(&given(MAX_FLOWS + 2)).is_err());
    }
}
