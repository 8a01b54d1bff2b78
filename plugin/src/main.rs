//! kubectl-streamapp: see the crate documentation (`lib.rs`) and `kubectl streamapp --help`.

use std::process::ExitCode;

use clap::Parser;
use kubectl_streamapp::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    match kubectl_streamapp::commands::run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
