use std::process::ExitCode;

use clap::Parser;

use quota_arbiter::cli::{Cli, Command};
use quota_arbiter::config::{self, Config};
use quota_arbiter::startup::Application;
use quota_arbiter::{operator, store, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load()?;
    telemetry::init(config.log_format);
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
            store::ensure_database(&config).await?;
            store::migrate(&store::connect_lazy(&config)?).await?;
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
        } => {
            let store = operator::connect(&config).await?;
            operator::report(&store, &config, quota.as_deref(), &since, ceiling).await?
        }
        Command::Keys { command } => {
            operator::keys::run(&operator::connect(&config).await?, command).await?
        }
    }
    Ok(())
}
