use std::process::ExitCode;

use clap::Parser;

use quota_arbiter::cli::{Cli, Command};
use quota_arbiter::config::Config;
use quota_arbiter::startup::Application;
use quota_arbiter::{bench, store, telemetry};

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
        Command::Bench(args) => bench::run(config, args).await?,
    }
    Ok(())
}
