//! The agent's loop: look, compute the entry, write it when due; on SIGTERM, wait for the
//! processor to finish, write the final entry, and exit.
//!
//! Thin on purpose: what is reported is [`crate::report::pod_status`], when it is written is
//! [`crate::cadence::Cadence`], how it is written is [`crate::status_writer::StatusWriter`].

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::{Api, Client};
use streamapp_api::crd::{PodStateStatus, StreamApp};
use streamapp_api::health::ProcessorPhase;
use streamapp_api::state_volume::StateDir;
use streamapp_api::status_values::PodPhase;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{debug, info, warn};

use crate::cadence::{Cadence, MIN_GAP};
use crate::cli::RunArgs;
use crate::error::{Error, Result};
use crate::identity::IdentitySource;
use crate::metrics::Metrics;
use crate::observe::{Observation, Observer};
use crate::report::{pod_status, significant};
use crate::status_writer::StatusWriter;
use crate::store_events::StoreEvents;

/// Attempts at the final report after SIGTERM (the pod is going away: no later chance).
const FINAL_REPORT_ATTEMPTS: u32 = 3;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Runs the agent until SIGTERM (or SIGINT); returns after the final report.
pub async fn run(args: RunArgs) -> Result<()> {
    if !args.state_dir.is_dir() {
        return Err(Error::NoStateDir(args.state_dir));
    }
    let client = Client::try_default().await.map_err(Error::KubeConfig)?;
    let metrics = Arc::new(Metrics::new());
    let identity = IdentitySource::new(
        client.clone(),
        &args.namespace,
        &args.pod_name,
        args.pod_uid.clone(),
    );
    crate::metrics::serve(args.metrics_port, metrics.clone(), Arc::new(identity)).await?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(Error::Signal)?;

    let app = match Api::<StreamApp>::namespaced(client.clone(), &args.namespace)
        .get(&args.app)
        .await
    {
        Ok(app) => Some(app),
        Err(source) => {
            // Not fatal: reports are retried, and the StreamApp may appear (or RBAC be fixed).
            let e = Error::ReadApp {
                namespace: args.namespace.clone(),
                app: args.app.clone(),
                source,
            };
            warn!(error = %e, "could not read the StreamApp at start-up");
            None
        }
    };
    let mut agent = Agent {
        observer: Observer::new(
            StateDir::new(&args.state_dir, args.wal_dir.clone()),
            args.processor_port,
        ),
        writer: StatusWriter::new(client.clone(), &args.namespace, &args.app, &args.pod_name)
            .with_uid(args.pod_uid.clone()),
        events: StoreEvents::new(
            client,
            &args.namespace,
            &args.app,
            &args.pod_name,
            app.as_ref(),
        ),
        cadence: Cadence::new(args.heartbeat),
        metrics,
        pod: args.pod_name.clone(),
    };
    info!(pod = %args.pod_name, namespace = %args.namespace, app = %args.app, state_dir = %args.state_dir.display(),
        processor_port = args.processor_port, heartbeat_s = args.heartbeat.as_secs(), "agent started");

    let mut tick = tokio::time::interval(args.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
        let (_, status) = agent.look().await;
        agent.write_if_due(&status).await;
    }

    info!(
        drain_wait_s = args.drain_wait.as_secs(),
        "stopping: waiting for the processor to finish"
    );
    let deadline = Instant::now() + args.drain_wait;
    let status = loop {
        let (obs, status) = agent.look().await;
        if processor_finished(&obs) {
            info!(phase = status.phase.as_ref().map_or("", PodPhase::as_str), clean = ?status.last_shutdown_clean, "the processor has finished");
            break status;
        }
        if Instant::now() >= deadline {
            warn!(
                phase = status.phase.as_ref().map_or("", PodPhase::as_str),
                "the processor did not finish within the drain wait"
            );
            break status;
        }
        agent.write_if_due(&status).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    agent.write_final(status).await;
    Ok(())
}

/// Whether the processor is done: drained, failed, or gone.
fn processor_finished(obs: &Observation) -> bool {
    let alive = obs.probes.healthz || obs.probes.pid_alive;
    let final_phase = obs
        .health
        .present()
        .is_some_and(|h| matches!(h.phase, ProcessorPhase::Drained | ProcessorPhase::Failed));
    final_phase || !alive
}

struct Agent {
    observer: Observer,
    writer: StatusWriter,
    events: StoreEvents,
    cadence: Cadence,
    metrics: Arc<Metrics>,
    pod: String,
}

impl Agent {
    /// One look at the processor and the disk, and the entry it makes.
    async fn look(&mut self) -> (Observation, PodStateStatus) {
        let observer = self.observer.clone();
        let obs = tokio::task::spawn_blocking(move || observer.observe())
            .await
            .expect("the observation does not panic");
        self.metrics.processor_up.set(i64::from(obs.probes.healthz));
        match self.events.announce(&obs.disk.quarantines).await {
            Ok(n) => {
                self.metrics.quarantine_events.inc_by(n as u64);
            }
            Err(e) => warn!(error = %e, kind = e.metric_label(), "quarantine event not published"),
        }
        if let Some(health) = obs.health.present() {
            match self.events.announce_backoffs(&health.tasks).await {
                Ok(n) => {
                    self.metrics.backoff_events.inc_by(n as u64);
                }
                Err(e) => {
                    warn!(error = %e, kind = e.metric_label(), "back-off event not published")
                }
            }
        }
        let status = pod_status(&self.pod, &obs.health, &obs.disk, &obs.probes, now_ms());
        (obs, status)
    }

    async fn write_if_due(&mut self, status: &PodStateStatus) {
        let key = significant(status);
        if self.cadence.due(&key, Instant::now()) {
            self.write(status, key).await;
        }
    }

    async fn write(&mut self, status: &PodStateStatus, key: PodStateStatus) -> bool {
        // The cadence counts from the start of a write, so a 2 s gap is 2 s, not 2 s plus
        // the API server's latency rounded up to the next look.
        let started = Instant::now();
        match self.writer.write(status).await {
            Ok(()) => {
                self.cadence.written(key, started);
                self.metrics.reports_written.inc();
                self.metrics.last_report_time.set(now_ms() as f64 / 1000.0);
                debug!(
                    phase = status.phase.as_ref().map_or("", PodPhase::as_str),
                    up = status.processor_up,
                    ready = status.ready,
                    "status written"
                );
                true
            }
            Err(e) => {
                self.cadence.failed(started);
                self.metrics.report_errors.inc();
                warn!(error = %e, kind = e.metric_label(), forbidden = e.is_forbidden(), "status write failed");
                false
            }
        }
    }

    /// The last word: written unless the last write said the same, after the minimum gap,
    /// retried a little.
    async fn write_final(&mut self, status: PodStateStatus) {
        let key = significant(&status);
        if self.cadence.is_current(&key) {
            info!(phase = status.phase.as_ref().map_or("", PodPhase::as_str), clean = ?status.last_shutdown_clean, "final status already written");
            return;
        }
        if let Some(at) = self.cadence.earliest_next() {
            tokio::time::sleep_until(at.into()).await;
        }
        for attempt in 1..=FINAL_REPORT_ATTEMPTS {
            if self.write(&status, key.clone()).await {
                info!(phase = status.phase.as_ref().map_or("", PodPhase::as_str), clean = ?status.last_shutdown_clean,
                    drain_ms = ?status.drain_duration_ms, "final status written");
                return;
            }
            if attempt < FINAL_REPORT_ATTEMPTS {
                tokio::time::sleep(MIN_GAP).await;
            }
        }
    }
}
