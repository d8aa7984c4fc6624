//! `GET /`: a small server-rendered dashboard (inline SVG, no JavaScript) that
//! reloads itself every few seconds.

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::ApiError;
use super::AppState;
use crate::durability::Durability;
use crate::store::{FlowRow, StoreError, UsageRow, WindowRow};

const REFRESH_SECONDS: u32 = 5;
const BAR_WIDTH: f64 = 560.0;
const CHART_HEIGHT: f64 = 120.0;
const COLUMN: f64 = 22.0;
/// Stacked series of the history chart: (CSS class, legend).
const SERIES: [(&str, &str); 5] = [
    ("granted", "granted"),
    ("would-defer", "would defer (observe)"),
    ("deferred", "deferred"),
    ("bypassed", "bypassed"),
    ("unthrottled", "unthrottled"),
];

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(dashboard))
}

/// Current windows, the last 24 windows and the flows, as one HTML page; a
/// store out of reach is a 503 page that says so and keeps reloading.
#[utoipa::path(get, path = "/", tag = "ops",
    responses((status = 200, description = "HTML dashboard", content_type = "text/html"),
        (status = 500, description = "A store error other than an outage", body = super::error::Problem,
         content_type = "application/problem+json"),
        (status = 503, description = "HTML page with an outage banner: the store cannot be reached",
         content_type = "text/html")))]
pub(crate) async fn dashboard(State(state): State<AppState>) -> Response {
    let why = match state.administration.dashboard().await {
        Ok((usage, windows, flows)) => {
            let durability = state.durability.durability();
            return Html(render(&usage, &windows, &flows, durability)).into_response();
        }
        Err(StoreError::Unavailable(why)) => why,
        Err(failed) => return ApiError::from(failed).into_response(),
    };
    tracing::warn!(cause = %why, "dashboard: store unavailable");
    let mut page = page_head();
    page.push_str(OUTAGE_BANNER);
    page.push_str("</body></html>");
    let retry = [(header::RETRY_AFTER, HeaderValue::from(REFRESH_SECONDS))];
    (StatusCode::SERVICE_UNAVAILABLE, retry, Html(page)).into_response()
}

const OUTAGE_BANNER: &str = r#"<div class="banner" role="alert"><b>The quota store cannot be reached.</b>
Enforced decisions answer 503 <code>store-unavailable</code>; observe, count and unknown flows and
deadline bypasses keep answering, and their slots are counted once the store is back. This page
retries every few seconds.</div>"#;

/// The page up to and including its title, shared by the dashboard and the outage page.
fn page_head() -> String {
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}"><title>quota-arbiter</title><style>{STYLE}</style></head>
<body><h1>quota-arbiter</h1><p class="muted">Refreshes every {REFRESH_SECONDS} s.</p>"#
    )
}

fn render(
    usage: &[UsageRow],
    windows: &[WindowRow],
    flows: &[FlowRow],
    durability: Durability,
) -> String {
    let mut page = page_head();
    page.push_str(match durability {
        Durability::Synchronous => {
            r#"<p id="durability">The store commits to a synchronous standby: a failover loses no answered grant.</p>"#
        }
        Durability::Asynchronous => {
            r#"<p id="durability" class="banner">The store replicates asynchronously (or not at all): a failover may lose answered grants and over-grant after.</p>"#
        }
        Durability::Unknown => {
            r#"<p id="durability" class="muted">The store's replication has not been read yet.</p>"#
        }
    });
    page.push_str(r#"<section id="current"><h2>Current window</h2>"#);
    for quota in usage {
        current_window(&mut page, quota);
    }
    if usage.is_empty() {
        page.push_str(r#"<p class="muted">No quotas yet.</p>"#);
    }
    page.push_str(r#"</section><section id="history"><h2>Last 24 windows</h2><p class="legend">"#);
    for (class, label) in SERIES {
        let _ = write!(page, r#"<span class="swatch {class}"></span>{label} "#);
    }
    page.push_str(r#"<span class="swatch ceiling"></span>ceiling</p>"#);
    // The history is hourly: decisions are tallied per hour, so it charts
    // each quota's `1h` windows.
    let mut by_quota: BTreeMap<&str, Vec<&WindowRow>> = BTreeMap::new();
    for window in windows.iter().filter(|w| w.period == "1h") {
        by_quota.entry(&window.quota).or_default().push(window);
    }
    // Columns sit at their hour: the current hour (as the database reports
    // it) is the rightmost of 24.
    let current = usage
        .iter()
        .find(|u| u.period == "1h")
        .map(|u| u.window_start);
    for (quota, rows) in by_quota {
        history(&mut page, quota, &rows, current);
    }
    page.push_str(r#"</section><section id="flows"><h2>Flows</h2><table><tr><th>flow</th><th>quota</th><th>mode</th><th>priority</th><th>to flip it</th></tr>"#);
    for flow in flows {
        flow_row(&mut page, flow);
    }
    page.push_str("</table></section></body></html>");
    page
}

/// One bar per window of each quota (design.md §12).
fn current_window(page: &mut String, q: &UsageRow) {
    let ratio = if q.ceiling > 0 {
        (q.count as f64 / q.ceiling as f64).min(1.0)
    } else {
        1.0
    };
    let over = if q.count > q.ceiling { " over" } else { "" };
    let percent = q
        .percent_used
        .map_or_else(|| "-".into(), |p| format!("{p:.1}%"));
    let _ = write!(
        page,
        r#"<div class="quota" data-quota="{name}" data-period="{period}"><h3>{name} <span class="period">{period}</span> <span class="numbers"><b class="count">{count}</b> / <b class="ceiling">{ceiling}</b> ({percent}) · {left} s left</span></h3>
<svg class="usage" width="{BAR_WIDTH}" height="22" viewBox="0 0 {BAR_WIDTH} 22" role="img" aria-label="{name} {period}: {count} of {ceiling}">
<rect class="track" x="0" y="0" width="{BAR_WIDTH}" height="22" rx="4"/><rect class="used{over}" data-count="{count}" x="0" y="0" width="{width:.1}" height="22" rx="4"/></svg></div>"#,
        name = escape(&q.quota),
        period = escape(&q.period),
        count = q.count,
        ceiling = q.ceiling,
        left = q.seconds_left,
        width = ratio * BAR_WIDTH,
    );
}

fn history(page: &mut String, quota: &str, rows: &[&WindowRow], current: Option<DateTime<Utc>>) {
    let stacks: Vec<[i64; 5]> = rows
        .iter()
        .map(|w| {
            [
                w.granted - w.would_defer,
                w.would_defer,
                w.deferred,
                w.bypassed,
                w.unthrottled,
            ]
        })
        .collect();
    let top = rows
        .iter()
        .zip(&stacks)
        .map(|(w, s)| w.ceiling.unwrap_or(0).max(w.count).max(s.iter().sum()))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let scale = CHART_HEIGHT / top;
    let width = COLUMN * 24.0;
    let _ = write!(
        page,
        r#"<div class="chart" data-quota="{name}"><h3>{name}</h3><svg width="{width}" height="{h}" viewBox="0 0 {width} {h}">"#,
        name = escape(quota),
        h = CHART_HEIGHT + 18.0,
    );
    for (i, (window, stack)) in rows.iter().zip(&stacks).enumerate() {
        let hours_ago = current.map_or(i as i64, |c| (c - window.window_start).num_hours());
        let x = (23 - hours_ago.clamp(0, 23)) as f64 * COLUMN + 2.0;
        let mut y = CHART_HEIGHT;
        for ((class, _), value) in SERIES.iter().zip(stack) {
            if *value == 0 {
                continue;
            }
            let height = *value as f64 * scale;
            y -= height;
            let _ = write!(
                page,
                r#"<rect class="{class}" data-value="{value}" x="{x}" y="{y:.1}" width="{w}" height="{height:.1}"><title>{at} {class}: {value}</title></rect>"#,
                w = COLUMN - 4.0,
                at = window.window_start.format("%H:%MZ"),
            );
        }
        let ceiling_y = CHART_HEIGHT - window.ceiling.unwrap_or(0) as f64 * scale;
        let _ = write!(
            page,
            r#"<line class="ceiling" x1="{x}" x2="{x2}" y1="{ceiling_y:.1}" y2="{ceiling_y:.1}"/><text x="{x}" y="{ty}">{hour}</text>"#,
            x2 = x + COLUMN - 4.0,
            ty = CHART_HEIGHT + 14.0,
            hour = window.window_start.format("%H"),
        );
    }
    page.push_str("</svg></div>");
}

fn flow_row(page: &mut String, flow: &FlowRow) {
    let next = if flow.mode == "enforce" {
        "observe"
    } else {
        "enforce"
    };
    // A partly enforced flow still lets most of its over-ceiling decisions through.
    let shown = match flow.enforced_percent() {
        Some(percent) if percent < 100 => format!("{} {percent}%", flow.mode),
        _ => flow.mode.clone(),
    };
    let _ = write!(
        page,
        r#"<tr data-flow="{name}"><td>{name}</td><td>{quota}</td><td><span class="mode {mode}">{shown}</span></td><td>{priority}</td><td><code>quota-arbiter flow {name} {next}</code><br><code>UPDATE flow SET mode = '{next}' WHERE name = '{name}';</code></td></tr>"#,
        name = escape(&flow.name),
        quota = escape(&flow.quota),
        mode = escape(&flow.mode),
        shown = escape(&shown),
        priority = flow.priority,
    );
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:980px}\
h1{margin:0}h2{margin-top:28px;border-bottom:1px solid #ddd}h3{margin:12px 0 4px;font-size:15px}\
.muted{color:#777}.numbers{font-weight:normal;color:#444}\
.track{fill:#eee}.used{fill:#2f7ed8}.used.over{fill:#d9534f}\
.granted{fill:#5cb85c}.would-defer{fill:#f0ad4e}.deferred{fill:#d9534f}.bypassed{fill:#8e44ad}.unthrottled{fill:#aaa}\
line.ceiling{stroke:#222;stroke-width:2}text{font-size:9px;fill:#777}\
.swatch{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-1px}\
.swatch.granted{background:#5cb85c}.swatch.would-defer{background:#f0ad4e}.swatch.deferred{background:#d9534f}\
.swatch.bypassed{background:#8e44ad}.swatch.unthrottled{background:#aaa}.swatch.ceiling{background:#222;height:2px;vertical-align:3px}\
table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}\
code{font-size:12px;color:#555}.banner{background:#fbe3e4;border:1px solid #d9534f;padding:12px;margin:16px 0;border-radius:4px}.mode{padding:1px 6px;border-radius:3px;color:#fff}\
.mode.observe{background:#2f7ed8}.mode.enforce{background:#5cb85c}.mode.count{background:#8e44ad}";
