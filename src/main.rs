use std::process::ExitCode;

use clap::Parser;

use quota_arbiter::cli::{Cli, Command};
use quota_arbiter::config::{self, Config};
use quota_arbiter::domain::PoolMode;
use quota_arbiter::report::WhatIf;
use quota_arbiter::startup::Application;
use quota_arbiter::{operator, store, telemetry};

/// glibc's malloc was a fifth of the service's CPU per decision (README,
/// Benchmark); mimalloc's thread-local free lists cost a fraction of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How many tasks a runtime worker runs between two looks for socket
/// readiness when it never runs out of tasks (tokio's default is 61). A
/// group's leader waits on the database's answer while the request tasks of
/// the next group keep the workers busy: with the default, the answer could
/// sit unnoticed behind dozens of them, and the whole group with it. Looking
/// every 7 tasks made the benchmark's paced arms faster by a fifth to a
/// third and left the others within their noise (docs/design.md §8).
const TASKS_BETWEEN_IO_LOOKS: u32 = 7;

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .event_interval(TASKS_BETWEEN_IO_LOOKS)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(serve_or_run()),
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve_or_run() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load()?;
    let log_to = match cli.command {
        Command::Serve => telemetry::LogTo::Stdout,
        _ => telemetry::LogTo::Stderr,
    };
    telemetry::init(config.log_format, log_to);
    for ignored in config::ignored_env_vars(
        std::env::vars_os().filter_map(|(name, _)| name.into_string().ok()),
    ) {
        match cli.command {
            Command::Serve => tracing::warn!("{ignored}"),
            _ => eprintln!("warning: {ignored}"),
        }
    }
    match cli.command {
        Command::Serve => {
            Application::build(config)
                .await?
                .run_until_stopped()
                .await?
        }
        Command::Migrate => {
            // Migrations hold a session lock: PostgreSQL itself, or a
            // session pooler (design.md §13).
            let url = config.session_url().ok_or_else(|| {
                anyhow::anyhow!(
                    "database_pool_mode is transaction: set direct_database_url \
                     (QUOTA_DIRECT_DATABASE_URL) to PostgreSQL itself to migrate"
                )
            })?;
            store::ensure_database(url.1).await?;
            store::migrate(&store::connect_lazy(
                url,
                PoolMode::Session,
                config.max_connections,
                config.store_timeout,
            )?)
            .await?;
            println!("migrations applied");
        }
        Command::Flows => operator::list_flows(&operator::connect(&config).await?).await?,
        Command::Flow(args) => {
            operator::change_flow(&operator::connect(&config).await?, &config, &args).await?
        }
        Command::Quota(args) => {
            operator::change_quota(&operator::connect(&config).await?, &config, &args).await?
        }
        Command::Windows { quota, last } => {
            operator::windows(&operator::connect(&config).await?, quota.as_deref(), last).await?
        }
        Command::Report {
            quota,
            since,
            ceiling,
            what_if,
        } => {
            let store = operator::connect(&config).await?;
            let what_if = (!what_if.is_empty()).then(|| what_if.join(","));
            let what_if = WhatIf::parse(what_if.as_deref(), ceiling).map_err(anyhow::Error::msg)?;
            operator::report(&store, &config, quota.as_deref(), &since, &what_if).await?
        }
        Command::Keys { command } => {
            operator::keys::run(&operator::connect(&config).await?, command).await?
        }
    }
    Ok(())
}
