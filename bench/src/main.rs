//! quota-arbiter-bench: decisions per second and latency of a real
//! `quota-arbiter serve` process, one arm per kind of quota, beside pgbench
//! replaying the service's own statements on the same database in the same
//! run; then the ratios the project targets, the service's resident memory,
//! and checks that speed cost no exactness. A measuring tool, not a test: it
//! prints what it measured and asserts nothing.

mod admit;
mod claims;
mod cpu;
mod drive;
mod exactness;
mod http;
mod pgbench;
mod pooler;
mod report;
mod reserve;
mod server;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use clap::Parser;
use quota_arbiter::config::Config;
use quota_arbiter::domain::catalog::{Mode, QuotaSettings, MAX_RATE};
use quota_arbiter::domain::window::{Period, WindowRule};
use quota_arbiter::domain::PoolMode;
use quota_arbiter::store::Store;
use sqlx::postgres::PgPoolOptions;

use crate::drive::{Arm, Load, Stop};
use crate::pgbench::{text_literal, with_literals, Pgbench};
use crate::report::Measured;
use crate::reserve::AfterReserving;
use crate::server::Service;
use crate::setup::{
    declare, declare_many, declare_route_class, declare_spending, UNREACHABLE_CEILING,
};

#[derive(Debug, Parser)]
#[command(
    name = "quota-arbiter-bench",
    version,
    about = "Measure a quota-arbiter service process arm by arm, beside pgbench baselines"
)]
struct Args {
    /// The database the service and pgbench use: a scratch one (created and
    /// migrated if needed; each run adds its own bench-* quotas).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The service binary [default: quota-arbiter next to this binary].
    #[arg(long)]
    server: Option<PathBuf>,
    /// The service's QUOTA_MAX_CONNECTIONS [default: the service's own default].
    #[arg(long)]
    server_max_connections: Option<u32>,
    /// Concurrent callers in every arm, and pgbench clients.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long each arm runs (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Quotas of each many-quotas arm (budget-only, paced); each request picks one at random.
    #[arg(long, default_value_t = 1000)]
    quotas: usize,
    /// Ceiling of the over-demand check and of the observed quota.
    #[arg(long, default_value_t = 500)]
    ceiling: i64,
    /// Cadence check: sustained tokens per second.
    #[arg(long, default_value_t = 100.0)]
    cadence_rate: f64,
    /// Cadence check: bucket size.
    #[arg(long, default_value_t = 10.0)]
    cadence_burst: f64,
    /// Distinct callers of the spread admission arm; each request picks one at random.
    #[arg(long, default_value_t = 10_000)]
    callers: usize,
    /// Items of each batch of the batch arm.
    #[arg(long, default_value_t = 100)]
    batch_items: usize,
    /// Skip the pending-work arms (enqueue, claims) and their baseline.
    #[arg(long)]
    no_claims: bool,
    /// The pgbench that runs the baselines.
    #[arg(long, default_value = "pgbench")]
    pgbench: PathBuf,
    /// Skip the pgbench baselines (their ratios then read n/a).
    #[arg(long)]
    no_pgbench: bool,
    /// The PgBouncer of the arm behind a transaction pooler [default:
    /// pgbouncer on PATH, or /usr/sbin/pgbouncer].
    #[arg(long)]
    pgbouncer: Option<PathBuf>,
    /// Skip the arm behind PgBouncer (also skipped, with a line, when there
    /// is no pgbouncer).
    #[arg(long)]
    no_pooler: bool,
}

/// `max_in_flight` of the release-cycle arm: as many places as callers, so
/// that no cycle should be deferred.
const CYCLE_PLACES: i32 = 64;
/// How long a cycle holds its place: a short emission.
const CYCLE_HOLD_MS: u64 = 1;

/// `max_in_flight` of the in-flight arm.
const IN_FLIGHT_PLACES: i32 = 10_000;

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The names of one run's quotas and flows, all under the run's tag.
struct Names {
    tag: String,
}

impl Names {
    fn of(&self, what: &str) -> String {
        format!("{}-{what}", self.tag)
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.quotas > 0, "--quotas must be at least 1");
    anyhow::ensure!(args.callers > 0, "--callers must be at least 1");
    let batch_items = 1..=quota_arbiter::reservations::MAX_BATCH_ITEMS;
    anyhow::ensure!(
        batch_items.contains(&args.batch_items),
        "--batch-items must be within {batch_items:?}"
    );
    let load_at_start = load_average();
    let binary = server::binary(args.server.clone())?;
    server::migrate(&binary, &args.database_url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&args.database_url)
        .await
        .context("connecting to DATABASE_URL")?;
    let options = pool.connect_options();
    let store = Store::new(pool);
    let synchronous_commit = sqlx::query_file_scalar!("sql/synchronous_commit.sql")
        .fetch_one(store.pool())
        .await?;

    let names = Names {
        tag: format!("bench-{}-{}", std::process::id(), Utc::now().timestamp()),
    };
    declare_run(&store, &names, &args).await?;

    let service = Service::start(&binary, &args.database_url, args.server_max_connections).await?;
    let (c, d) = (args.concurrency, args.duration);
    let load = Load {
        client: Arc::new(http::Client::new(&service.base, c)?),
        concurrency: c,
        duration: d,
    };
    let database = options
        .get_database()
        .unwrap_or(options.get_username())
        .to_string();
    let (pid, db) = (service.pid(), database.as_str());
    let one = |flow: String| move || flow.clone();

    // Each baseline runs right before the arm it is compared with (the
    // service idles meanwhile), so that other work on the machine weighs on
    // both alike.
    let pgbench = (!args.no_pgbench).then(|| Pgbench {
        program: args.pgbench.clone(),
        database_url: args.database_url.clone(),
        database: database.clone(),
        concurrency: c,
        duration: d,
    });
    let bare_upsert = include_str!("../sql/bare_upsert.sql");
    let ceiling = UNREACHABLE_CEILING.to_string();

    let healthz = cpu::metered(pid, db, reserve::healthz(&load)).await?;
    let hot = text_literal(&names.of("pg-hot"));
    let script = with_literals(bare_upsert, &[&hot, "1", &ceiling, "false"]) + ";\n";
    let bare_hot = baseline(pgbench.as_ref(), "bare upsert, hot row (pgbench)", &script).await?;
    let name = "budget only, enforce";
    let enforce = reserve::arm(&load, name, Stop::Elapsed, one(names.of("enforce")));
    let enforce = cpu::metered(pid, db, enforce).await?;
    let pooled = match pooler::program(args.pgbouncer.clone()).filter(|_| !args.no_pooler) {
        Some(program) => {
            let flow = names.of("enforce");
            let pooled = behind_a_pooler(&program, &binary, &args, &load, &flow, db).await?;
            Some(pooled)
        }
        None => None,
    };
    let name = "budget only, three windows (1m, 1h, 1d), enforce";
    let stacked = reserve::arm(&load, name, Stop::Elapsed, one(names.of("stacked")));
    let stacked = cpu::metered(pid, db, stacked).await?;
    let name = "two quotas per call (1m and 1d; 1m), enforce";
    let two_quotas = reserve::arm(&load, name, Stop::Elapsed, one(names.of("two")));
    let two_quotas = cpu::metered(pid, db, two_quotas).await?;
    let name = format!("budget only, observe (ceiling {})", args.ceiling);
    let observe = reserve::arm(&load, &name, Stop::Elapsed, one(names.of("observe")));
    let observe = cpu::metered(pid, db, observe).await?;
    let name = "with cadence (never refusing), enforce";
    let cadence = reserve::arm(&load, name, Stop::Elapsed, one(names.of("cadence")));
    let cadence = cpu::metered(pid, db, cadence).await?;
    let name = format!("max_in_flight {IN_FLIGHT_PLACES}, enforce");
    let in_flight = reserve::arm(&load, &name, Stop::Elapsed, one(names.of("in-flight")));
    let in_flight = cpu::metered(pid, db, in_flight).await?;
    let name = format!("reserve, hold {CYCLE_HOLD_MS} ms, release ({CYCLE_PLACES} places)");
    let hold = AfterReserving::Release(Duration::from_millis(CYCLE_HOLD_MS));
    let flow = names.of("cycle");
    let cycles = reserve::cycle_arm(&load, &name, &flow, hold);
    let release_cycles = cpu::metered(pid, db, cycles).await?;
    let name = "reserve, report 429 (adaptive cadence)";
    let flow = names.of("storm");
    let storm = reserve::cycle_arm(&load, name, &flow, AfterReserving::Report(429));
    let report_storm = cpu::metered(pid, db, storm).await?;
    let name = format!("batches of {}, enforce (per batch)", args.batch_items);
    let flow = names.of("batch");
    let batch = reserve::batch_arm(&load, &name, &flow, args.batch_items);
    let batch = cpu::metered(pid, db, batch).await?;
    let quotas = args.quotas;
    let spread = format!("({} || :q)", text_literal(&names.of("pg-spread-")));
    let script = format!("\\set q random(1, {quotas})\n")
        + &with_literals(bare_upsert, &[&spread, "1", &ceiling, "false"])
        + ";\n";
    let name = format!("bare upsert, {quotas} rows (pgbench)");
    let bare_spread = baseline(pgbench.as_ref(), &name, &script).await?;
    // Each request names one of the `quotas` quotas declared under `prefix`.
    let random_quota = |prefix: &str| {
        let spread = names.of(prefix);
        move || format!("{spread}{}", fastrand::usize(1..=quotas))
    };
    let name = format!("{quotas} budget-only quotas, enforce");
    let many_quotas = reserve::arm(&load, &name, Stop::Elapsed, random_quota("spread-"));
    let many_quotas = cpu::metered(pid, db, many_quotas).await?;
    let name = format!("{quotas} paced quotas (never refusing)");
    let many_paced = reserve::arm(&load, &name, Stop::Elapsed, random_quota("paced-spread-"));
    let many_paced = cpu::metered(pid, db, many_paced).await?;
    let class = names.of("admit");
    let hot = admit::arm(&load, "admit, one hot caller", &class, || 0);
    let admit_hot = cpu::metered(pid, db, hot).await?;
    let callers = args.callers;
    let name = format!("admit, {callers} callers");
    let spread = admit::arm(&load, &name, &class, move || fastrand::usize(0..callers));
    let admit_spread = cpu::metered(pid, db, spread).await?;
    let (mut enqueue, mut claims, mut raw_claim, mut claim_done) = (None, None, None, None);
    if !args.no_claims {
        // The baseline first, on a queue of its own: after the claims arm the
        // table holds tens of thousands of items just claimed, whose dead
        // index entries pgbench's statements (planned anew on every run, as
        // their parameters are literals) would pay for, not the service's.
        if let Some(pgbench) = &pgbench {
            let quota = names.of("pg-claim");
            raw_claim = Some(claims::raw_claim_baseline(pgbench, &store, &quota).await?);
        }
        let work = names.of("work");
        let enqueued = claims::enqueue(&load, &work);
        enqueue = Some(cpu::metered(pid, db, enqueued).await?);
        let claimed = claims::claim(&load, &work);
        claims = Some(cpu::metered(pid, db, claimed).await?);
        let cycle_flow = names.of("work-cycle");
        let cycles = claims::claim_done_cycles(&load, &cycle_flow);
        claim_done = Some(cpu::metered(pid, db, cycles).await?);
    }
    let over_demand = exactness::over_demand(&load, &names.of("capped"), args.ceiling).await?;
    let cadence_check = (args.cadence_rate, args.cadence_burst);
    let paced = exactness::paced_grants(&load, &names.of("paced"), cadence_check).await?;
    let memory = service.resident_memory()?;
    service.stop().await?;

    let catalog_quotas = sqlx::query_file_scalar!("sql/catalog_size.sql")
        .fetch_one(store.pool())
        .await?;
    let measured = Measured {
        healthz,
        enforce,
        pooled,
        stacked,
        two_quotas,
        observe,
        cadence,
        in_flight,
        release_cycles,
        report_storm,
        batch,
        many_quotas,
        many_paced,
        admit_hot,
        admit_spread,
        enqueue,
        claims,
        claim_done,
        bare_hot,
        bare_spread,
        raw_claim,
        memory,
        quotas,
    };
    println!(
        "quota-arbiter-bench, {}: {c} concurrent callers, {d:?} per arm",
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
    );
    println!(
        "service pool of {} connections, {catalog_quotas} quotas in the catalog, synchronous_commit = {synchronous_commit}",
        args.server_max_connections
            .unwrap_or(Config::default().max_connections)
    );
    println!(
        "load average of the machine (1, 5, 15 min): {load_at_start} at the start, {} at the end",
        load_average()
    );
    report::print_arms(&measured.arms());
    println!();
    report::print_targets(&measured.targets());
    for line in report::busy_cores_bounds(&measured, args.concurrency) {
        println!("{line}");
    }
    println!();
    println!(
        "service resident memory: VmRSS {} kB after the run, VmHWM (peak) {} kB",
        memory.now_kb, memory.peak_kb
    );
    match measured.pooled_share() {
        Some(line) => println!("{line}"),
        None => println!("behind PgBouncer: not measured (--no-pooler, or no pgbouncer)"),
    }
    println!("{over_demand}");
    println!("{paced}");
    Ok(())
}

/// The 1, 5 and 15 minute load averages of the machine: other work on it
/// moves every figure of the run.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_string())
}

/// The quotas and flows of every arm, before the service starts.
async fn declare_run(store: &Store, names: &Names, args: &Args) -> anyhow::Result<()> {
    let far = QuotaSettings::sized(UNREACHABLE_CEILING);
    let never_refusing = QuotaSettings {
        rate: Some(MAX_RATE),
        burst: Some(MAX_RATE),
        adaptive: false,
        ..far.clone()
    };
    let in_flight = QuotaSettings {
        max_in_flight: Some(IN_FLIGHT_PLACES),
        ..far.clone()
    };
    let paced = QuotaSettings {
        rate: Some(args.cadence_rate),
        burst: Some(args.cadence_burst),
        adaptive: false,
        ..far.clone()
    };
    let capped = QuotaSettings::sized(args.ceiling);
    let (enforce, observe) = (Some(Mode::Enforce), Some(Mode::Observe));
    declare(store, &names.of("enforce"), &far, enforce).await?;
    let window = |period: &str| WindowRule {
        period: Period::parse(period).expect("a period"),
        ceiling: UNREACHABLE_CEILING,
        zone: None,
    };
    let stacked = QuotaSettings {
        windows: vec![window("1m"), window("1h"), window("1d")],
        ..far.clone()
    };
    declare(store, &names.of("stacked"), &stacked, enforce).await?;
    // An LLM's limits: requests a minute and a day, tokens a minute, spent
    // together by flow `two`.
    let requests = QuotaSettings {
        windows: vec![window("1m"), window("1d")],
        ..far.clone()
    };
    let tokens = QuotaSettings {
        windows: vec![window("1m")],
        ..far.clone()
    };
    let (two_requests, two_tokens) = (names.of("two-requests"), names.of("two-tokens"));
    declare(store, &two_requests, &requests, None).await?;
    declare(store, &two_tokens, &tokens, None).await?;
    declare_spending(
        store,
        &names.of("two"),
        &[&two_requests, &two_tokens],
        Mode::Enforce,
    )
    .await?;
    declare(store, &names.of("observe"), &capped, observe).await?;
    declare(store, &names.of("cadence"), &never_refusing, enforce).await?;
    declare(store, &names.of("in-flight"), &in_flight, enforce).await?;
    let cycle_places = QuotaSettings {
        max_in_flight: Some(CYCLE_PLACES),
        ..far.clone()
    };
    declare(store, &names.of("cycle"), &cycle_places, enforce).await?;
    let adaptive = QuotaSettings {
        adaptive: true,
        ..never_refusing.clone()
    };
    declare(store, &names.of("storm"), &adaptive, enforce).await?;
    declare(store, &names.of("batch"), &far, enforce).await?;
    declare(store, &names.of("work"), &far, enforce).await?;
    declare(store, &names.of("work-cycle"), &far, enforce).await?;
    declare(store, &names.of("capped"), &capped, enforce).await?;
    declare(store, &names.of("paced"), &paced, enforce).await?;
    declare_many(store, &names.of("spread-"), args.quotas, &far, enforce).await?;
    let paced_spread = names.of("paced-spread-");
    declare_many(store, &paced_spread, args.quotas, &never_refusing, enforce).await?;
    declare(store, &names.of("pg-hot"), &far, None).await?;
    declare(store, &names.of("pg-claim"), &far, None).await?;
    declare_many(store, &names.of("pg-spread-"), args.quotas, &far, None).await?;
    declare_route_class(store, &names.of("admit")).await?;
    Ok(())
}

/// The budget arm's flow, asked of a second service that reaches the
/// database through a PgBouncer of its own in transaction pooling (the
/// first idles meanwhile).
async fn behind_a_pooler(
    program: &std::path::Path,
    binary: &std::path::Path,
    args: &Args,
    load: &Load,
    flow: &str,
    db: &str,
) -> anyhow::Result<Arm> {
    // As many server connections as the service's own pool by default, so
    // that the arm measures the pooler's way of running statements, not
    // fewer connections.
    let connections = args.server_max_connections;
    let servers = connections.unwrap_or(Config::default().max_connections);
    let transaction = PoolMode::Transaction;
    let pooler = pooler::Pooler::start(program, &args.database_url, transaction, servers).await?;
    let settings = [
        ("QUOTA_DATABASE_POOL_MODE", "transaction"),
        ("QUOTA_DIRECT_DATABASE_URL", args.database_url.as_str()),
    ];
    let service = Service::start_with(binary, pooler.url(), connections, &settings).await?;
    let load = Load {
        client: Arc::new(http::Client::new(&service.base, load.concurrency)?),
        ..load.clone()
    };
    let name = "budget only, enforce, behind PgBouncer (transaction pooling)";
    let flow = flow.to_string();
    let arm = reserve::arm(&load, name, Stop::Elapsed, move || flow.clone());
    let arm = cpu::metered(service.pid(), db, arm).await?;
    service.stop().await?;
    Ok(arm)
}

/// A pgbench baseline, unless the run skips them.
async fn baseline(
    pgbench: Option<&Pgbench>,
    name: &str,
    script: &str,
) -> anyhow::Result<Option<Arm>> {
    match pgbench {
        Some(pgbench) => Ok(Some(pgbench.run(name, script).await?)),
        None => Ok(None),
    }
}
