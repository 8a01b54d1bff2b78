//! The StreamApp operator: reconciles `StreamApp` resources into a StatefulSet, a headless
//! Service, a ConfigMap with the processor configuration, a PodDisruptionBudget, a NetworkPolicy
//! and the agent's RBAC, and aggregates the pods' state into the StreamApp's status.
//!
//! Pure builders compute what should exist; [`reconcile`] fetches, calls them and applies:
//!
//! - [`statefulset`], [`service`], [`processor_config`], [`disruption_budget`],
//!   [`network_policy`], [`rbac`]: the owned objects, all marked by [`owned`].
//! - [`preflight`]: what CEL cannot check (configuration, memory budget); blocks rollouts.
//! - [`storage`]: growing volumes that StatefulSets cannot grow.
//! - [`scaling`]: scale-in one pod at a time, once the remaining pods hold the state.
//! - [`reset`], [`cleanup`]: the application reset and the cleanup after deletion, as state
//!   machines.
//! - [`kafka`]: the StreamApp's topics and consumer group, seen with its own credentials; the
//!   admin operations of reset and cleanup.
//! - [`transaction_doctor`]: hanging transactions told from slow ones, and when one may be
//!   ended (decisions only so far; not wired into the reconciler yet).
//! - [`pod_health`]: what the kubelet reports about pods that cannot start or were OOM-killed.
//! - [`secrets`]: the Secrets the pods read, hashed into the pod template.
//! - [`rollout`]: rollouts that cannot get stuck; replacing a StatefulSet whose immutable
//!   policy is outdated.
//! - [`status`]: the aggregate status and its conditions; [`events`]: what is worth an Event.
//! - [`leader`]: Lease-based leader election; [`metrics`]: Prometheus metrics and health.
//! - [`cli`]: flags and the program's entry point; [`run`]: the operator as a library call
//!   (the integration tests run it in-process).

pub mod cleanup;
pub mod cli;
pub mod crd_yaml;
pub mod disruption_budget;
pub mod error;
pub mod events;
pub mod kafka;
pub mod leader;
pub mod metrics;
pub mod network_policy;
pub mod node_loss;
pub mod owned;
pub mod pod_health;
pub mod preflight;
pub mod processor_config;
pub mod rbac;
pub mod reconcile;
pub mod reset;
pub mod rollout;
pub mod scaling;
pub mod secrets;
pub mod service;
pub mod spec_reference;
pub mod statefulset;
pub mod status;
pub mod storage;
pub mod task_reports;
#[cfg(test)]
mod testing;
pub mod transaction_doctor;

use std::future::Future;
use std::sync::Arc;

use kube::api::ListParams;
use kube::{Api, Client};
use streamapp_api::crd::StreamApp;
use tracing::info;

pub use error::{Error, Result};
use leader::{Elector, LeaseSettings};
use metrics::Metrics;
use reconcile::Context;

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Port of `/metrics` and `/healthz` (0: any free port).
    pub metrics_port: u16,
    /// Run the controller only while holding this lease (None: always).
    pub leader_election: Option<LeaseSettings>,
    /// Watch only this namespace (None: every namespace).
    pub namespace: Option<String>,
    /// This instance's name in events and the lease.
    pub identity: String,
}

/// Runs the operator until `shutdown` completes (Ok) or it loses its leadership (Err: the
/// process should exit so that it restarts as a follower).
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    ensure_crd_installed(&client, settings.namespace.as_deref()).await?;
    let (addr, server) = metrics::serve(settings.metrics_port, metrics.clone()).await?;
    info!(%addr, "serving /metrics and /healthz");
    let server = tokio::spawn(server);
    let result = lead(client, settings, metrics, shutdown).await;
    server.abort();
    result
}

async fn lead(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics.clone(),
        settings.identity.clone(),
    ));
    let controller = reconcile::run_controller(ctx, settings.namespace.clone());
    let Some(lease) = settings.leader_election else {
        metrics.leader.set(1);
        // No election loop to watch: liveness is the process answering.
        let beats = metrics.clone();
        let heartbeat = async move {
            loop {
                beats.probes.beat();
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        };
        tokio::select! {
            _ = controller => {}
            _ = heartbeat => {}
            _ = &mut shutdown => info!("shutting down"),
        }
        return Ok(());
    };
    let mut elector = Elector::new(client, lease, metrics.clone());
    // A follower is ready: it serves metrics and takes over when the leader goes.
    metrics.probes.set_ready(true);
    tokio::select! {
        _ = elector.acquire() => {}
        _ = &mut shutdown => return Ok(()),
    }
    metrics.probes.set_ready(false);
    metrics.leader.set(1);
    let result = tokio::select! {
        _ = controller => Ok(()),
        lost = elector.hold() => Err(lost),
        _ = &mut shutdown => {
            info!("shutting down");
            Ok(())
        }
    };
    metrics.leader.set(0);
    if result.is_ok() {
        elector.release().await;
    }
    result
}

/// Fails fast, with an install hint, when the StreamApp CRD is not served.
pub async fn ensure_crd_installed(client: &Client, namespace: Option<&str>) -> Result<()> {
    let api: Api<StreamApp> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing),
        Err(e) => Err(Error::CrdCheck(e)),
    }
}
