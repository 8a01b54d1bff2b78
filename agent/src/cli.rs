//! The agent's command line. Every flag has an environment variable: the operator configures
//! the sidecar through env (see the pod contract in docs/design.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use streamapp_api::units::parse_duration;

/// Where the operator mounts the state volume.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/streamapp/state";

#[derive(Parser, Debug)]
#[command(
    name = "streamapp-agent",
    version,
    about = "Reports a StreamApp pod's state-store health into the StreamApp status"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Watch the processor and its state volume, and report into status.pods[<pod>] until
    /// SIGTERM.
    Run(RunArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// This pod's name: the key of the entry in status.pods.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// This pod's UID (the downward API's `metadata.uid`), in every entry: it tells this pod's
    /// reports from those of an older pod of the same name.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Namespace of the pod and its StreamApp.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Name of the StreamApp this pod belongs to.
    #[arg(long = "app", env = "STREAMAPP_NAME")]
    pub app: String,
    /// The processor's state directory (the state volume).
    #[arg(long, env = "STREAMAPP_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The processor's separate WAL directory, when it has one.
    #[arg(long, env = "STREAMAPP_WAL_DIR")]
    pub wal_dir: Option<PathBuf>,
    /// Port of the processor's HTTP server (/healthz, /readyz) on localhost.
    #[arg(long, env = "STREAMAPP_PROCESSOR_PORT", default_value_t = 8080)]
    pub processor_port: u16,
    /// Longest time between two status writes when nothing significant changes.
    #[arg(long, env = "STREAMAPP_HEARTBEAT", default_value = "30s", value_parser = parse_duration)]
    pub heartbeat: Duration,
    /// How often to look at the processor and the disk.
    #[arg(long, env = "STREAMAPP_AGENT_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// After SIGTERM, how long to wait for the processor to finish its drain (or stop) before
    /// the final report.
    #[arg(long, env = "STREAMAPP_AGENT_DRAIN_WAIT", default_value = "90s", value_parser = parse_duration)]
    pub drain_wait: Duration,
    /// Port of the agent's own /metrics and /healthz.
    #[arg(long, env = "STREAMAPP_AGENT_METRICS_PORT", default_value_t = 8081)]
    pub metrics_port: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_contract_env_is_enough_to_run() {
        // Flags stand in for the env here (set_var is unsafe under edition 2024).
        let cli = Cli::try_parse_from([
            "streamapp-agent",
            "run",
            "--pod-name",
            "orders-0",
            "--namespace",
            "shop",
            "--app",
            "orders",
            "--heartbeat",
            "1m",
        ])
        .unwrap();
        let Command::Run(args) = cli.command;
        assert_eq!(args.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(args.processor_port, 8080);
        assert_eq!(args.metrics_port, 8081);
        assert_eq!(args.heartbeat, Duration::from_secs(60));
        assert_eq!(args.drain_wait, Duration::from_secs(90));
    }

    #[test]
    fn a_heartbeat_that_is_not_a_go_duration_is_refused() {
        let err = Cli::try_parse_from([
            "streamapp-agent",
            "run",
            "--pod-name",
            "p",
            "--namespace",
            "n",
            "--app",
            "a",
            "--heartbeat",
            "30",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("not a duration"), "{err}");
    }
}
