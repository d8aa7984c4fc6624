//! Operator commands: they talk to the database directly, so they work with no
//! replica running, and every change they make is audited as `cli:<os user>`.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::catalog::{validate_name, Mode};
use crate::config::Config;
use crate::report::{self, Report};
use crate::store::{FlowChange, FlowRow, Store};

pub async fn connect(config: &Config) -> anyhow::Result<Store> {
    let options = PgConnectOptions::from_str(config.database_url.expose())?
        .application_name("quota-arbiter-cli");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the database at {:?}: {e}",
                config.database_url
            )
        })?;
    Ok(Store::new(pool))
}

/// Who the audit trail names for a change made from this shell.
pub fn cli_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("id").arg("-un").output().ok()?;
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|u| !u.is_empty())
        })
        .unwrap_or_else(|| "unknown".into());
    format!("cli:{user}")
}

pub async fn list_flows(store: &Store) -> anyhow::Result<()> {
    let flows = store.list_flows().await?;
    println!(
        "{:<24} {:<16} {:<8} {:>8} {:>8}",
        "flow", "quota", "mode", "priority", "enforce%"
    );
    for f in &flows {
        print_flow(f);
    }
    if flows.is_empty() {
        println!("(no flows)");
    }
    Ok(())
}

fn print_flow(f: &FlowRow) {
    let percent = f
        .enforced_percent()
        .map_or_else(|| "-".into(), |p| p.to_string());
    println!(
        "{:<24} {:<16} {:<8} {:>8} {:>8}",
        f.name, f.quota, f.mode, f.priority, percent
    );
}

/// Flips a flow's mode; `quota` creates the flow when it does not exist yet.
pub async fn flip_flow(
    store: &Store,
    config: &Config,
    name: &str,
    mode: Mode,
    quota: Option<String>,
    enforce_percent: Option<i16>,
) -> anyhow::Result<()> {
    validate_name(name).map_err(|why| anyhow::anyhow!("flow name {why}"))?;
    anyhow::ensure!(
        enforce_percent.is_none_or(|p| (1..=100).contains(&p)),
        "--percent must be between 1 and 100"
    );
    let actor = cli_actor();
    let row = match quota {
        Some(quota) => {
            validate_name(&quota).map_err(|why| anyhow::anyhow!("--quota {why}"))?;
            let change = FlowChange {
                quota,
                mode: Some(mode),
                enforce_percent,
                ..FlowChange::default()
            };
            store
                .put_flow(&actor, name, &change, config.hourly_ceiling)
                .await?
        }
        None => store
            .set_flow_mode(&actor, name, mode, enforce_percent)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no flow `{name}`; add --quota Q to create it"))?,
    };
    print_flow(&row);
    Ok(())
}

pub async fn set_quota(store: &Store, name: &str, hourly_ceiling: i64) -> anyhow::Result<()> {
    validate_name(name).map_err(|why| anyhow::anyhow!("quota name {why}"))?;
    crate::catalog::validate_limits(hourly_ceiling, None, None)
        .map_err(|why| anyhow::anyhow!("--hourly-ceiling: {why}"))?;
    store
        .set_quota_ceiling(&cli_actor(), name, hourly_ceiling)
        .await?;
    println!("{name} hourly_ceiling={hourly_ceiling}");
    Ok(())
}

pub async fn windows(store: &Store, quota: Option<&str>, last: i32) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=744).contains(&last),
        "--last must be between 1 and 744 hours"
    );
    let rows = store.recent_windows(quota, last).await?;
    println!(
        "{:<16} {:<20} {:>8} {:>8} {:>8} {:>8} {:>11} {:>8} {:>11}",
        "quota",
        "window_start",
        "count",
        "ceiling",
        "granted",
        "deferred",
        "would_defer",
        "bypassed",
        "unthrottled"
    );
    for w in &rows {
        println!(
            "{:<16} {:<20} {:>8} {:>8} {:>8} {:>8} {:>11} {:>8} {:>11}",
            w.quota,
            w.window_start.format("%Y-%m-%d %H:%MZ"),
            w.count,
            w.hourly_ceiling,
            w.granted,
            w.deferred,
            w.would_defer,
            w.bypassed,
            w.unthrottled
        );
    }
    if rows.is_empty() {
        println!("(no windows in the last {last} hours)");
    }
    Ok(())
}

pub async fn report(
    store: &Store,
    config: &Config,
    quota: Option<&str>,
    since: &str,
    ceiling: Option<i64>,
) -> anyhow::Result<()> {
    let since = report::parse_since(since).map_err(|e| anyhow::anyhow!("--since {e}"))?;
    let report =
        report::observe_report(store, quota, since, ceiling, config.history_retention).await?;
    print_report(&report);
    Ok(())
}

fn print_report(report: &Report) {
    println!("({})", report.reach);
    if report.flows.is_empty() {
        println!("no flow is in observe mode");
    }
    for flow in &report.flows {
        println!("{}", flow.verdict);
        println!("  quota {} (ceiling {})", flow.quota, flow.hourly_ceiling);
        if let Some(with_deadline) = flow.would_defer_with_deadline {
            println!("  of which carried a deadline: {with_deadline}");
        }
        for hour in &flow.worst_hours {
            println!(
                "  {}  would defer {:>6} of {:>6}",
                hour.window_start.format("%Y-%m-%d %H:%MZ"),
                hour.would_defer,
                hour.decisions
            );
        }
    }
}
