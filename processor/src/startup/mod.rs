//! `streamapp-processor run`: from the command line to running processing threads.
//!
//! In order: the configuration is loaded and resolved once ([`configuration`]: the file, the
//! flags and the environment over it); the state dir is made ready (an interrupted quarantine
//! finished, whether the last stop was clean); the HTTP server and the signal handler start;
//! the topics are checked ([`topic_checks`]); after a fence, the agent confirms that this pod
//! is still the current one ([`identity_gate`]); the engines run until they drained or failed.
//! Each way of not starting has its exit code ([`crate::EXIT_CONFIG`] when restarting cannot
//! help).

mod configuration;
mod identity_gate;
mod topic_checks;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use streamapp_api::config::ResolvedConfig;
use streamapp_api::health::{DrainRequest, ProcessorHealth, ProcessorPhase};
use streamapp_api::state_volume::{StateDir, checkpoint};
use streamapp_processor::engine::{EngineConfig, EngineError};
use streamapp_processor::faults::Faults;
use streamapp_processor::metrics::Metrics;
use streamapp_processor::shared::{DrainOutcome, Shared, now_ms};
use streamapp_processor::store::SharedMemory;
use streamapp_processor::{dead_letters, http, lookup, quarantine, workers};
use tokio::runtime::Runtime;
use tracing::{error, info, warn};

use crate::{EXIT_CONFIG, EXIT_FAILED, EXIT_FENCED};

/// The `run` command's flags; each also comes from the environment the operator sets.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The configuration file (YAML; see streamapp_api::config::ProcessorConfig).
    #[arg(long, env = "STREAMAPP_CONFIG")]
    pub config: PathBuf,
    /// This instance's stable identity: the pod name. Used for transactional.id and
    /// group.instance.id.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// Overrides `stateDir` of the configuration.
    #[arg(long, env = "STREAMAPP_STATE_DIR")]
    pub state_dir: Option<String>,
    /// Overrides `walDir` of the configuration.
    #[arg(long, env = "STREAMAPP_WAL_DIR")]
    pub wal_dir: Option<String>,
    /// Overrides `httpPort` of the configuration.
    #[arg(long, env = "STREAMAPP_HTTP_PORT")]
    pub http_port: Option<u16>,
    /// Overrides `kafka.bootstrapServers` of the configuration.
    #[arg(long, env = "STREAMAPP_BOOTSTRAP_SERVERS")]
    pub bootstrap_servers: Option<String>,
    /// SASL username (from a Secret), becomes `sasl.username`.
    #[arg(long, env = "KAFKA_SASL_USERNAME", hide_env_values = true)]
    pub sasl_username: Option<String>,
    /// SASL password (from a Secret), becomes `sasl.password`.
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub sasl_password: Option<String>,
    /// Directory with `ca.crt` (and optionally `tls.crt`, `tls.key`) for TLS to Kafka.
    #[arg(long, env = "STREAMAPP_KAFKA_TLS_DIR")]
    pub kafka_tls_dir: Option<PathBuf>,
    /// Bearer token that allows the drain endpoint from other hosts.
    #[arg(long, env = "STREAMAPP_DRAIN_TOKEN", hide_env_values = true)]
    pub drain_token: Option<String>,
    /// Port of the agent beside this processor in the pod, asked after a fence whether this
    /// pod is still the current one (`streamapp_api::identity`). Without it, a fenced
    /// processor joins again without asking.
    #[arg(long, env = "STREAMAPP_AGENT_PORT")]
    pub agent_port: Option<u16>,
}

/// Runs the processor until it drained (exit 0), was fenced, or failed.
pub fn run(args: RunArgs) -> ExitCode {
    let config = match configuration::load(&args) {
        Ok(c) => c,
        Err(e) => {
            error!("{e:#}");
            eprintln!("streamapp-processor: {e:#}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let (state, previous_shutdown_clean) = match prepare_state_dir(&config) {
        Ok(ready) => ready,
        Err(message) => {
            eprintln!("streamapp-processor: {message}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let mut health = ProcessorHealth::new(&args.pod_name, &config.application_id, now_ms());
    health.previous_shutdown_clean = previous_shutdown_clean;
    info!(
        pod = %args.pod_name,
        application_id = %config.application_id,
        state_dir = %config.state_dir.display(),
        previous_shutdown_clean = ?health.previous_shutdown_clean,
        processing_threads = config.processing_threads,
        "starting"
    );
    let shared = Arc::new(Shared::new(
        state,
        health,
        config.processing_threads as usize,
    ));
    shared.set_phase(ProcessorPhase::Starting);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::new(&mut registry);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let listener =
        match runtime.block_on(tokio::net::TcpListener::bind(("0.0.0.0", config.http_port))) {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "streamapp-processor: cannot listen on port {}: {e}",
                    config.http_port
                );
                return ExitCode::from(EXIT_FAILED);
            }
        };
    shared.beat_all();
    let queries = Arc::new(OnceLock::new());
    runtime.spawn(http::serve(
        listener,
        shared.clone(),
        Arc::new(registry),
        http::HttpOptions {
            drain_token: args.drain_token.clone(),
            drain_timeout: config.drain_timeout,
            liveness_timeout: config.liveness_timeout,
            queries: queries.clone(),
        },
    ));
    runtime.spawn(drain_on_signal(shared.clone()));

    let client = configuration::kafka_client(&config, &args);
    let checked = match topic_checks::run(&runtime, &config, client, || shared.beat_all()) {
        Ok(checked) => checked,
        Err(failed) => {
            error!("{}", failed.message);
            eprintln!("streamapp-processor: {}", failed.message);
            shared.update(true, |h| {
                h.phase = ProcessorPhase::Failed;
                h.error = Some(failed.message.clone());
            });
            // A refusal (the configuration or the topics must change) or Kafka not answering.
            return ExitCode::from(if failed.refusal {
                EXIT_CONFIG
            } else {
                EXIT_FAILED
            });
        }
    };
    let _ = queries.set(http::Queries {
        lookup: lookup::Settings {
            pod: args.pod_name.clone(),
            retention_ms: config.topology.retention.as_millis() as i64,
            input_topic: config.topology.input_topic.as_str().into(),
            route_partitions: config
                .repartition_topic
                .is_some()
                .then_some(checked.input_partitions),
        },
        dead_letters: dead_letters::Settings {
            pod: args.pod_name.clone(),
            client: checked.client.clone(),
            topic: config.topology.dead_letter_topic.clone(),
        },
    });
    let engine_config = EngineConfig::new(
        &config,
        &args.pod_name,
        checked.input_partitions,
        checked.client,
        // The downward API's spec.nodeName, set by the operator.
        std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
    );
    let process = workers::Process {
        memory: SharedMemory::new(&config.rocksdb, config.group.standby_replicas > 0),
        shared,
        metrics,
    };
    let shared = &process.shared;
    if !identity_gate::wait_until_current(&shared.state_dir, args.agent_port, shared) {
        // Stopped while waiting: nothing joined, so there is nothing to drain.
        shared.update(true, |h| {
            h.phase = ProcessorPhase::Drained;
            h.drain_duration_ms = Some(0);
        });
        shared.finish_drain(DrainOutcome::Drained { duration_ms: 0 });
        stop(runtime);
        return ExitCode::SUCCESS;
    }
    let code = match workers::run(&engine_config, &process, Faults::from_env()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("streamapp-processor: {e}");
            if let EngineError::Fenced { .. } = e {
                identity_gate::record_fence(&process.shared.state_dir, &e.to_string());
            }
            ExitCode::from(exit_code(&e))
        }
    };
    stop(runtime);
    code
}

/// The exit code of an engine that failed for good.
fn exit_code(e: &EngineError) -> u8 {
    match e {
        EngineError::Fenced { .. } => EXIT_FENCED,
        EngineError::TopicUnusable { .. } => EXIT_CONFIG,
        _ => EXIT_FAILED,
    }
}

/// Creates the state dir and finishes moving a store into quarantine that a crash
/// interrupted, before any store is opened (a store created beside the damaged one's WAL
/// would be refused as damaged). With it, whether the last shutdown was clean.
fn prepare_state_dir(config: &ResolvedConfig) -> Result<(StateDir, Option<bool>), String> {
    let state = StateDir::new(&config.state_dir, config.wal_dir.clone());
    std::fs::create_dir_all(state.root()).map_err(|e| {
        format!(
            "cannot create the state dir {}: {e}",
            state.root().display()
        )
    })?;
    let finished = quarantine::finish_interrupted(&state)
        .map_err(|e| format!("finishing an interrupted quarantine: {e}"))?;
    for path in finished {
        warn!(path = %path.display(), "finished moving a store into quarantine that a crash interrupted");
    }
    let clean = previous_shutdown_clean(&state);
    Ok((state, clean))
}

/// Whether the last shutdown drained: every task dir has a checkpoint. `None` on first start.
fn previous_shutdown_clean(state: &StateDir) -> Option<bool> {
    let tasks = state.task_partitions();
    if tasks.is_empty() {
        return None;
    }
    Some(tasks.iter().all(|&p| {
        checkpoint::read(&state.checkpoint_file(p))
            .ok()
            .flatten()
            .is_some()
    }))
}

/// SIGTERM (the kubelet stopping the pod) or Ctrl-C drains the processor.
async fn drain_on_signal(shared: Arc<Shared>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    info!("termination signal: draining");
    shared.request_drain(DrainRequest::Signal);
}

/// Stops the HTTP server and the signal handler, once the drain request that may be waiting
/// had time to get its answer out.
fn stop(runtime: Runtime) {
    std::thread::sleep(Duration::from_millis(300));
    runtime.shutdown_timeout(Duration::from_secs(1));
}
