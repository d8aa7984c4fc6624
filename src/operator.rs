//! Operator commands: they talk to the database directly, so they work with no
//! replica running, and every change they make is audited as `cli:<os user>`.

pub mod keys;

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

use crate::cli::{FlowArgs, QuotaArgs};
use crate::config::Config;
use crate::domain::{PoolMode, QuotaName};
use crate::report::{self, Report, WhatIf};
use crate::store::{self, CatalogError, FlowRow, Store, WhenMissing};

pub async fn connect(config: &Config) -> anyhow::Result<Store> {
    // PostgreSQL itself when named; else `database_url`, through whatever
    // pooler it names.
    let (url, mode) = match config.session_url() {
        Some(url) => (url, PoolMode::Session),
        None => (
            ("database_url", &config.database_url),
            config.database_pool_mode,
        ),
    };
    let options = store::connect_options(url, mode)?.application_name("quota-arbiter-cli");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the database at {:?}: {e}", url.1))?;
    Ok(Store::with_mode(pool, mode))
}

/// Who the audit trail names for a change made from this shell.
pub(crate) fn cli_actor() -> String {
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
        "{:<24} {:<16} {:<8} {:>8} {:>8} fallback",
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
        "{:<24} {:<16} {:<8} {:>8} {:>8} {}",
        f.name,
        // Several quotas, spent together in each call: `requests+tokens`.
        f.quotas.join("+"),
        f.mode,
        f.priority,
        percent,
        f.fallback
    );
}

/// `flow NAME [MODE] [--quota Q] …`: the same change as `PATCH /v1/flows/NAME`.
pub async fn change_flow(store: &Store, config: &Config, args: &FlowArgs) -> anyhow::Result<()> {
    let create_quota = args.create_quota.then_some(config.hourly_ceiling);
    let row = store
        .patch_flow(
            &cli_actor(),
            &args.name,
            args.patch(),
            WhenMissing::Create,
            create_quota,
        )
        .await
        .map_err(cli_error)?;
    print_flow(&row);
    Ok(())
}

/// `quota NAME [--hourly-ceiling N] …`: the same change as `PATCH /v1/quotas/NAME`.
pub async fn change_quota(store: &Store, config: &Config, args: &QuotaArgs) -> anyhow::Result<()> {
    let patch = args.patch().map_err(anyhow::Error::msg)?;
    let row = store
        .patch_quota(
            &cli_actor(),
            &args.name,
            patch,
            WhenMissing::Create,
            config.hourly_ceiling,
        )
        .await
        .map_err(cli_error)?;
    let setting = |name: &str, value: Option<String>| value.map(|v| format!(" {name}={v}"));
    let line: String = [
        setting("rate", row.rate.map(|v| v.to_string())),
        setting("burst", row.burst.map(|v| v.to_string())),
        setting("adaptive", row.rate.map(|_| row.adaptive.to_string())),
        setting("max_in_flight", row.max_in_flight.map(|v| v.to_string())),
        setting(
            "priority2_share",
            row.priority2_share.map(|v| v.to_string()),
        ),
        setting(
            "priority3_share",
            row.priority3_share.map(|v| v.to_string()),
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let windows: Vec<String> = row.windows.iter().map(ToString::to_string).collect();
    println!("{} windows={}{line}", row.name, windows.join(","));
    Ok(())
}

/// A refused change reads as the API's problem detail would.
fn cli_error(error: CatalogError) -> anyhow::Error {
    match error {
        CatalogError::Store(error) => anyhow::Error::new(error),
        refused => anyhow::anyhow!("{refused}"),
    }
}

/// A quota named on the command line must exist: a typo is an error, not an
/// empty answer.
async fn known_quota(store: &Store, quota: Option<&str>) -> anyhow::Result<()> {
    if let Some(quota) = quota {
        QuotaName::parse(quota).map_err(|why| anyhow::anyhow!("--quota {why}"))?;
        anyhow::ensure!(store.quota(quota).await?.is_some(), "no quota `{quota}`");
    }
    Ok(())
}

pub async fn windows(store: &Store, quota: Option<&str>, last: i32) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=744).contains(&last),
        "--last must be between 1 and 744 hours"
    );
    known_quota(store, quota).await?;
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
            format!("{} {}", w.quota, w.period),
            w.window_start.format("%Y-%m-%d %H:%MZ"),
            w.count,
            w.ceiling.map_or_else(|| "-".to_string(), |c| c.to_string()),
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
    what_if: &WhatIf,
) -> anyhow::Result<()> {
    let since = report::parse_since(since).map_err(|e| anyhow::anyhow!("--since {e}"))?;
    known_quota(store, quota).await?;
    let report = report::observe_report(store, quota, since, what_if, config.history_retention);
    let report = report.await?.map_err(anyhow::Error::msg)?;
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
        for window in &flow.windows {
            let ceiling = match window.what_if_ceiling {
                Some(what_if) => format!("what-if {what_if}, own {}", window.ceiling),
                None => window.ceiling.to_string(),
            };
            let fullest = window.fullest.as_ref().map_or(0, |f| f.count);
            println!(
                "  {} {} (ceiling {ceiling}): {} of {} windows over, {} slots over, fullest {fullest}",
                window.quota, window.period, window.windows_over, window.windows, window.slots_over
            );
        }
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
