//! The operator's command line: flags (each with an environment variable) and the program's
//! entry point.

use std::sync::Arc;

use clap::{ArgAction, Parser, ValueEnum};
use kube::Client;
use tracing::info;

use crate::error::{Error, Result};
use crate::leader::{LeaseSettings, identity};
use crate::metrics::Metrics;
use crate::{Settings, run};

#[derive(Parser, Debug)]
#[command(
    name = "streamapp-operator",
    version,
    about = "Reconciles StreamApp resources into StatefulSets, Services, ConfigMaps, PodDisruptionBudgets and RBAC"
)]
pub struct Args {
    /// Port of /metrics (Prometheus) and /healthz.
    #[arg(long, env = "STREAMAPP_METRICS_PORT", default_value_t = 8080)]
    pub metrics_port: u16,
    /// Elect a leader among the operator's replicas with a Lease; only the leader reconciles.
    /// `--leader-election false` to run without (a single replica).
    #[arg(long, env = "STREAMAPP_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    pub leader_election: bool,
    /// Namespace of the leader Lease (`streamapp-operator`): the operator's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "STREAMAPP_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Log format.
    #[arg(long, env = "STREAMAPP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Args {
    pub fn settings(&self) -> Settings {
        let identity = identity();
        Settings {
            metrics_port: self.metrics_port,
            leader_election: self
                .leader_election
                .then(|| LeaseSettings::new(self.lease_namespace.clone(), identity.clone())),
            namespace: self.namespace.clone(),
            identity,
        }
    }
}

/// The program: logs, connects, runs until SIGTERM / Ctrl-C or until leadership is lost.
pub async fn main(args: Args) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let settings = args.settings();
    info!(identity = %settings.identity, leader_election = args.leader_election, namespace = ?settings.namespace, "starting");
    let client = Client::try_default()
        .await
        .map_err(Error::kube("connecting to the Kubernetes API"))?;
    run(
        client,
        settings,
        Arc::new(Metrics::default()),
        shutdown_signal(),
    )
    .await
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
