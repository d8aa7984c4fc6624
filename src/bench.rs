//! `quota-arbiter bench`: decisions per second and latency of the HTTP path on
//! one hot quota, next to baselines measured in the same run with the same
//! concurrency: the bare conditional upsert issued directly through sqlx, and
//! the same statement under `pgbench` when it is installed. A measuring tool,
//! not a test.

mod claim_arm;
mod pgbench;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::catalog::Mode;
use crate::catalog::{FlowSettings, QuotaSettings};
use crate::config::Config;
use crate::decision::{Decision, Outcome};
use crate::startup::Application;
use crate::store::{self, Store};

const BENCH_ACTOR: &str = "bench";

/// A ceiling no run can reach: throughput arms measure grants, not refusals.
const UNREACHABLE_CEILING: i64 = 1 << 50;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Concurrent callers, for every arm.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// How long each throughput arm runs (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Ceiling of the over-demand check (demand is four times the ceiling).
    #[arg(long, default_value_t = 500)]
    pub ceiling: i64,
    /// Skip the pgbench baseline even when pgbench is installed.
    #[arg(long)]
    pub no_pgbench: bool,
    /// Cadence check: sustained tokens per second of a cadence quota.
    #[arg(long, default_value_t = 100.0)]
    pub cadence_rate: f64,
    /// Cadence check: bucket size.
    #[arg(long, default_value_t = 10.0)]
    pub cadence_burst: f64,
    /// Work items to enqueue for the claim arm (POST /v1/work/claim); 0 skips it.
    #[arg(long, default_value_t = 2000)]
    pub claim_items: usize,
}

struct ArmResult {
    name: String,
    per_second: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
}

impl ArmResult {
    /// An arm's rate with the percentiles of its `sorted` latencies.
    fn measured(name: &str, per_second: f64, sorted: &[Duration]) -> Self {
        Self {
            name: name.to_string(),
            per_second,
            p50_ms: percentile_ms(sorted, 0.50),
            p99_ms: percentile_ms(sorted, 0.99),
        }
    }
}

pub async fn run(config: Config, args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    store::ensure_database(&config).await?;
    let server_config = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_connections: (args.concurrency as u32).clamp(4, 64),
        ..config.clone()
    };
    let pool = store::connect_lazy(&server_config)?;
    store::migrate(&pool).await?;
    let store = Store::new(pool.clone());
    let tag = format!("bench-{}-{}", std::process::id(), Utc::now().timestamp());
    let hot = format!("{tag}-http");
    let bare = format!("{tag}-bare");
    let capped = format!("{tag}-capped");
    let queued = format!("{tag}-work");
    let ceiling = QuotaSettings::sized;
    for (name, settings) in [
        (&hot, ceiling(UNREACHABLE_CEILING)),
        (&queued, ceiling(UNREACHABLE_CEILING)),
        (&bare, ceiling(UNREACHABLE_CEILING)),
        (&capped, ceiling(args.ceiling)),
    ] {
        declare(&store, name, &settings, Mode::Enforce).await?;
    }
    // New flows start in observe mode, so observation carries full traffic:
    // a ceiling well below the demand, so most decisions would defer.
    let watched = format!("{tag}-observe");
    declare(&store, &watched, &ceiling(args.ceiling), Mode::Observe).await?;
    let paced = format!("{tag}-cadence");
    let cadence = QuotaSettings {
        rate: Some(args.cadence_rate),
        burst: Some(args.cadence_burst),
        adaptive: false,
        ..ceiling(UNREACHABLE_CEILING)
    };
    declare(&store, &paced, &cadence, Mode::Enforce).await?;

    let app = Application::build_with_pool(server_config, pool.clone()).await?;
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;

    let mut arms = Vec::new();
    let (http_client, url, flow) = (client.clone(), format!("{base}/v1/reserve"), hot.clone());
    arms.push(
        drive(
            "HTTP POST /v1/reserve (enforce)",
            args.concurrency,
            args.duration,
            move || {
                let (client, url, flow) = (http_client.clone(), url.clone(), flow.clone());
                async move { reserve(&client, &url, &flow).await.map(|_| ()) }
            },
        )
        .await?,
    );
    let (http_client, url) = (client.clone(), format!("{base}/v1/reserve"));
    arms.push(
        drive(
            "HTTP POST /v1/reserve (observe)",
            args.concurrency,
            args.duration,
            move || {
                let (client, url, flow) = (http_client.clone(), url.clone(), watched.clone());
                async move { reserve(&client, &url, &flow).await.map(|_| ()) }
            },
        )
        .await?,
    );
    let bare_store = store.clone();
    arms.push(
        drive(
            "bare upsert via sqlx (baseline)",
            args.concurrency,
            args.duration,
            move || {
                let (store, quota) = (bare_store.clone(), bare.clone());
                async move {
                    store
                        .reserve_slots(&quota, 1, UNREACHABLE_CEILING, false)
                        .await?;
                    Ok(())
                }
            },
        )
        .await?,
    );
    if !args.no_pgbench {
        match pgbench(&config, &store, &tag, args.concurrency, args.duration).await {
            Ok(arm) => arms.push(arm),
            Err(error) => println!("(pgbench baseline skipped: {error:#})"),
        }
    }
    let over_demand = over_demand(&client, &base, &capped, args.ceiling, args.concurrency).await?;
    let paced = paced_grants(&client, &base, &paced, &args).await?;
    let work_arms = match args.claim_items {
        0 => Vec::new(),
        items => {
            let (concurrency, duration) = (args.concurrency, args.duration);
            let mut arms =
                claim_arm::run(&client, &base, &queued, items, concurrency, duration).await?;
            if !args.no_pgbench {
                match claim_arm::pgbench_baseline(&config, &store, &tag, concurrency, duration)
                    .await
                {
                    Ok(arm) => arms.push(arm),
                    Err(error) => println!("(pgbench claim baseline skipped: {error:#})"),
                }
            }
            arms
        }
    };
    let _ = stop.send(());
    server.await??;

    print_report(&args, &arms, &over_demand);
    println!(
        "cadence check: rate {}/s, burst {}: {} granted in {:.1} s = {:.1} grants/s (ideal {:.1}/s: rate + burst spread over the run)",
        args.cadence_rate,
        args.cadence_burst,
        paced.granted,
        paced.seconds,
        paced.granted as f64 / paced.seconds,
        args.cadence_rate + args.cadence_burst / paced.seconds
    );
    if !work_arms.is_empty() {
        println!(
            "pending-work registry, {} items on one enforced quota:",
            args.claim_items
        );
        print_arms(&work_arms);
    }
    Ok(())
}

/// A quota and a flow of the same name in `mode`, for one arm.
async fn declare(
    store: &Store,
    name: &str,
    settings: &QuotaSettings,
    mode: Mode,
) -> anyhow::Result<()> {
    store.put_quota(BENCH_ACTOR, name, settings).await?;
    let flow = FlowSettings {
        quota: name.to_string(),
        mode,
        priority: crate::catalog::DEFAULT_PRIORITY,
        enforce_percent: None,
    };
    store.put_flow(BENCH_ACTOR, name, &flow, None).await?;
    Ok(())
}

async fn reserve(client: &reqwest::Client, url: &str, flow: &str) -> anyhow::Result<Decision> {
    let response = client
        .post(url)
        .json(&serde_json::json!({ "flow": flow }))
        .send()
        .await?
        .error_for_status()?;
    Ok(response.json().await?)
}

/// Runs `call` from `concurrency` tasks for `duration`; latency per call.
async fn drive<F, Fut>(
    name: &str,
    concurrency: usize,
    duration: Duration,
    call: F,
) -> anyhow::Result<ArmResult>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let until = Instant::now() + duration;
    drive_calls(name, concurrency, usize::MAX, move |_| {
        let call = call.clone();
        async move {
            if Instant::now() >= until {
                return Ok(false);
            }
            call().await?;
            Ok(true)
        }
    })
    .await
}

/// Calls `call(n)` for n = 0.. from `concurrency` tasks until `total` calls
/// or a call answers `false`; the rate and latencies of the `true` calls.
async fn drive_calls<F, Fut>(
    name: &str,
    concurrency: usize,
    total: usize,
    call: F,
) -> anyhow::Result<ArmResult>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<bool>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (call, next) = (call.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= total {
                        return anyhow::Ok(latencies);
                    }
                    let t = Instant::now();
                    if !call(n).await? {
                        return Ok(latencies);
                    }
                    latencies.push(t.elapsed());
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let per_second = latencies.len() as f64 / elapsed;
    Ok(ArmResult::measured(name, per_second, &latencies))
}

fn percentile_ms(sorted: &[Duration], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let index = ((last as f64) * p).round() as usize;
    Some(sorted[index].as_secs_f64() * 1000.0)
}

/// The server's conditional upsert under pgbench, on a quota of its own.
async fn pgbench(
    config: &Config,
    store: &Store,
    tag: &str,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<ArmResult> {
    let quota = format!("{tag}-pgbench");
    let sized = QuotaSettings::sized(UNREACHABLE_CEILING);
    store.put_quota(BENCH_ACTOR, &quota, &sized).await?;
    let (name, ceiling) = (format!("'{quota}'"), UNREACHABLE_CEILING.to_string());
    let statement = include_str!("../sql/reserve_slots.sql");
    let script = pgbench::with_literals(statement, &[&name, "1", &ceiling, "false"]) + ";\n";
    let name = "same upsert via pgbench (baseline)";
    pgbench::run(config, name, &script, concurrency, duration).await
}

struct OverDemand {
    asked: usize,
    granted: usize,
    deferred: usize,
    ceiling: i64,
}

/// Four times the ceiling, asked concurrently over HTTP on an enforced flow.
async fn over_demand(
    client: &reqwest::Client,
    base: &str,
    flow: &str,
    ceiling: i64,
    concurrency: usize,
) -> anyhow::Result<OverDemand> {
    let asked = (ceiling.max(1) * 4) as usize;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, flow, next) = (
            client.clone(),
            format!("{base}/v1/reserve"),
            flow.to_string(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < asked {
                outcomes.push(reserve(&client, &url, &flow).await?.outcome);
            }
            anyhow::Ok(outcomes)
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.extend(task.await??);
    }
    let count = |o: Outcome| outcomes.iter().filter(|x| **x == o).count();
    Ok(OverDemand {
        asked,
        granted: count(Outcome::Granted),
        deferred: count(Outcome::Deferred),
        ceiling,
    })
}

fn print_arms(arms: &[ArmResult]) {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
    for arm in arms {
        println!(
            "{:<40} {:>12.0} {:>9} {:>9}",
            arm.name,
            arm.per_second,
            ms(arm.p50_ms),
            ms(arm.p99_ms)
        );
    }
}

fn print_report(args: &BenchArgs, arms: &[ArmResult], over: &OverDemand) {
    println!(
        "quota-arbiter bench, {}, {} concurrent callers, {:?} per arm, one hot quota",
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        args.concurrency,
        args.duration
    );
    println!(
        "{:<40} {:>12} {:>9} {:>9}",
        "arm", "decisions/s", "p50 ms", "p99 ms"
    );
    print_arms(arms);
    let rate = |prefix: &str| {
        arms.iter()
            .find(|a| a.name.starts_with(prefix))
            .map(|a| a.per_second)
    };
    for mode in ["enforce", "observe"] {
        let http = rate(&format!("HTTP POST /v1/reserve ({mode})"));
        for (baseline, name) in [
            ("bare upsert", "bare upsert (sqlx)"),
            ("same upsert", "same upsert (pgbench)"),
        ] {
            if let (Some(http), Some(base)) = (http, rate(baseline)) {
                println!("HTTP {mode} / {name}: {:.2}", http / base);
            }
        }
    }
    println!(
        "over-demand check: asked {}, granted {}, deferred {}, ceiling {} -> {}",
        over.asked,
        over.granted,
        over.deferred,
        over.ceiling,
        if over.granted as i64 == over.ceiling {
            "exact"
        } else {
            "MISMATCH"
        }
    );
}

struct PacedGrants {
    granted: usize,
    seconds: f64,
}

/// Callers hammer a cadence quota for the run's duration: the grants per
/// second should match the sustained rate (plus the initial burst).
async fn paced_grants(
    client: &reqwest::Client,
    base: &str,
    flow: &str,
    args: &BenchArgs,
) -> anyhow::Result<PacedGrants> {
    let started = Instant::now();
    let until = started + args.duration;
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (client, url, flow) = (
            client.clone(),
            format!("{base}/v1/reserve"),
            flow.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut granted = 0;
            while Instant::now() < until {
                let decision = reserve(&client, &url, &flow).await?;
                match decision.outcome {
                    Outcome::Granted => granted += 1,
                    // Ask again when the next token is due, as a worker would.
                    _ => {
                        let wait = decision
                            .retry_at
                            .map(|at| (at - Utc::now()).num_milliseconds().clamp(1, 1000))
                            .unwrap_or(10);
                        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                    }
                }
            }
            anyhow::Ok(granted)
        }));
    }
    let mut granted = 0;
    for task in tasks {
        granted += task.await??;
    }
    Ok(PacedGrants {
        granted,
        seconds: started.elapsed().as_secs_f64(),
    })
}
