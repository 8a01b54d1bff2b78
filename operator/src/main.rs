//! streamapp-operator: reconciles StreamApp resources (see the library for the parts).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    streamapp_operator::cli::main(streamapp_operator::cli::Args::parse()).await?;
    Ok(())
}
