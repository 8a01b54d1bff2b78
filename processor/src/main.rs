//! streamapp-processor: the exactly-once dedup processor that runs in each StreamApp pod.
//!
//! `run` processes ([`startup`]), `drain` (the preStop hook) asks the running processor to
//! drain and waits ([`drain`]), `inspect` shows what is on a state volume.

mod drain;
mod startup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use streamapp_api::units::parse_duration;
use streamapp_processor::inspect;

/// jemalloc for every allocation of the process: Rust's through this, RocksDB's and
/// librdkafka's through the unprefixed `malloc` it exports (the workspace's Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit codes: what a supervisor (and a test) can tell apart.
const EXIT_FAILED: u8 = 1;
/// The configuration, or a start-up check of the topics, refused: restarting does not help.
const EXIT_CONFIG: u8 = 2;
const EXIT_FENCED: u8 = 3;

#[derive(Parser)]
#[command(
    name = "streamapp-processor",
    version,
    about = "Exactly-once Kafka dedup processor with a crash-safe RocksDB store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the processor.
    Run(startup::RunArgs),
    /// Ask the processor on this host to drain (finish the transaction, flush, checkpoint,
    /// stop) and wait for it. Exit code 0 when drained.
    Drain {
        /// Port of the processor's HTTP server.
        #[arg(long, env = "STREAMAPP_HTTP_PORT", default_value_t = 8080)]
        port: u16,
        /// How long to wait.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Print the tasks, stored offsets, checkpoints, WAL files and quarantines of a state dir.
    Inspect {
        state_dir: PathBuf,
        /// Separate WAL directory, if the processor uses one.
        #[arg(long)]
        wal_dir: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,librdkafka=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a container's log is a file (kubectl logs, log shippers).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Run(args) => startup::run(args),
        Command::Drain { port, timeout } => drain::run(port, timeout),
        Command::Inspect {
            state_dir,
            wal_dir,
            json,
        } => {
            let report = inspect::inspect(&state_dir, wal_dir.as_deref());
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report serialises")
                );
            } else {
                print!("{}", inspect::render(&report));
            }
            ExitCode::SUCCESS
        }
    }
}
