//! streamapp-agent: the StreamApp pod sidecar that reports state-store health.

use clap::Parser;
use streamapp_agent::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run(args) => Ok(streamapp_agent::run::run(args).await?),
    }
}
