//! streamapp-processor: the exactly-once dedup processor that runs in each StreamApp pod.
//!
//! `run` processes, `drain` (the preStop hook) asks the running processor to drain and waits,
//! `inspect` shows what is on a state volume.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rdkafka::config::ClientConfig;
use streamapp_api::config::{ProcessorConfig, ResolvedConfig};
use streamapp_api::health::{ProcessorHealth, ProcessorPhase};
use streamapp_api::units::parse_duration;
use streamapp_processor::engine::{EngineConfig, EngineError};
use streamapp_processor::shared::{Shared, now_ms};
use streamapp_processor::state_dir::StateDir;
use streamapp_processor::store::SharedMemory;
use streamapp_processor::topics::{self, WrittenTopic};
use streamapp_processor::{
    changelog, checkpoint, faults::Faults, http, inspect, metrics::Metrics, quarantine,
    repartition, workers,
};
use tracing::{error, info, warn};

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
    Run(RunArgs),
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

#[derive(clap::Args)]
struct RunArgs {
    /// The configuration file (YAML; see streamapp_api::config::ProcessorConfig).
    #[arg(long, env = "STREAMAPP_CONFIG")]
    config: PathBuf,
    /// This instance's stable identity: the pod name. Used for transactional.id and
    /// group.instance.id.
    #[arg(long, env = "POD_NAME")]
    pod_name: String,
    /// Overrides `stateDir` of the configuration.
    #[arg(long, env = "STREAMAPP_STATE_DIR")]
    state_dir: Option<String>,
    /// Overrides `walDir` of the configuration.
    #[arg(long, env = "STREAMAPP_WAL_DIR")]
    wal_dir: Option<String>,
    /// Overrides `httpPort` of the configuration.
    #[arg(long, env = "STREAMAPP_HTTP_PORT")]
    http_port: Option<u16>,
    /// Overrides `kafka.bootstrapServers` of the configuration.
    #[arg(long, env = "STREAMAPP_BOOTSTRAP_SERVERS")]
    bootstrap_servers: Option<String>,
    /// SASL username (from a Secret), becomes `sasl.username`.
    #[arg(long, env = "KAFKA_SASL_USERNAME", hide_env_values = true)]
    sasl_username: Option<String>,
    /// SASL password (from a Secret), becomes `sasl.password`.
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true)]
    sasl_password: Option<String>,
    /// Directory with `ca.crt` (and optionally `tls.crt`, `tls.key`) for TLS to Kafka.
    #[arg(long, env = "STREAMAPP_KAFKA_TLS_DIR")]
    kafka_tls_dir: Option<PathBuf>,
    /// Bearer token that allows the drain endpoint from other hosts.
    #[arg(long, env = "STREAMAPP_DRAIN_TOKEN", hide_env_values = true)]
    drain_token: Option<String>,
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
        Command::Run(args) => run(args),
        Command::Drain { port, timeout } => drain(port, timeout),
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

fn drain(port: u16, timeout: Duration) -> ExitCode {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    match streamapp_api::probe::call(addr, "POST", streamapp_api::probe::DRAIN, timeout) {
        Ok(r) if r.status == 200 => {
            println!("{}", r.body.trim());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            eprintln!("drain failed (HTTP {}): {}", r.status, r.body.trim());
            ExitCode::from(EXIT_FAILED)
        }
        // Nothing listens: there is no running processor to drain.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            eprintln!("no processor is listening on {addr}: nothing to drain");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drain request to {addr} failed: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// The configuration file with flags and environment applied, resolved.
fn load_config(args: &RunArgs) -> anyhow::Result<ResolvedConfig> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let mut config: ProcessorConfig = serde_yaml::from_str(&text)
        .with_context(|| format!("invalid configuration file {}", args.config.display()))?;
    if let Some(d) = &args.state_dir {
        config.state_dir = d.clone();
    }
    if let Some(d) = &args.wal_dir {
        config.wal_dir = Some(d.clone());
    }
    if let Some(p) = args.http_port {
        config.http_port = p;
    }
    if let Some(b) = &args.bootstrap_servers {
        config.kafka.bootstrap_servers = b.clone();
    }
    Ok(config.resolve()?)
}

fn client_config(config: &ResolvedConfig, args: &RunArgs) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    for (k, v) in &config.kafka.properties {
        client.set(k, v);
    }
    if let Some(u) = &args.sasl_username {
        client.set("sasl.username", u);
    }
    if let Some(p) = &args.sasl_password {
        client.set("sasl.password", p);
    }
    if let Some(dir) = &args.kafka_tls_dir {
        client.set("ssl.ca.location", dir.join("ca.crt").display().to_string());
        if dir.join("tls.crt").exists() && dir.join("tls.key").exists() {
            client.set(
                "ssl.certificate.location",
                dir.join("tls.crt").display().to_string(),
            );
            client.set(
                "ssl.key.location",
                dir.join("tls.key").display().to_string(),
            );
        }
    }
    client
}

fn run(args: RunArgs) -> ExitCode {
    let config = match load_config(&args) {
        Ok(c) => c,
        Err(e) => {
            error!("{e:#}");
            eprintln!("streamapp-processor: {e:#}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let state = StateDir::new(&config.state_dir, config.wal_dir.clone());
    if let Err(e) = std::fs::create_dir_all(state.root()) {
        eprintln!(
            "streamapp-processor: cannot create the state dir {}: {e}",
            state.root().display()
        );
        return ExitCode::from(EXIT_FAILED);
    }
    // A crash in the middle of moving a damaged store aside is finished before any store is
    // opened (a store created beside the damaged one's WAL would be refused as damaged).
    match quarantine::finish_interrupted(&state) {
        Ok(finished) => {
            for path in finished {
                warn!(path = %path.display(), "finished moving a store into quarantine that a crash interrupted");
            }
        }
        Err(e) => {
            eprintln!("streamapp-processor: finishing an interrupted quarantine: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    }
    let mut health = ProcessorHealth::new(&args.pod_name, &config.application_id, now_ms());
    health.previous_shutdown_clean = previous_shutdown_clean(&state);
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
    runtime.spawn(http::serve(
        listener,
        shared.clone(),
        Arc::new(registry),
        http::HttpOptions {
            drain_token: args.drain_token.clone(),
            drain_timeout: config.drain_timeout,
            liveness_timeout: config.liveness_timeout,
        },
    ));
    let signal_shared = shared.clone();
    runtime.spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("termination signal: draining");
        signal_shared.request_drain(streamapp_api::health::DrainRequest::Signal);
    });

    let client = client_config(&config, &args);
    let fail_start = |e: &dyn std::fmt::Display, code: u8| {
        error!("{e}");
        eprintln!("streamapp-processor: {e}");
        shared.update(true, |h| {
            h.phase = ProcessorPhase::Failed;
            h.error = Some(e.to_string());
        });
        ExitCode::from(code)
    };
    // A refusal (the configuration or the topics must change) or Kafka not answering.
    let exit_code = |refusal: bool| if refusal { EXIT_CONFIG } else { EXIT_FAILED };
    let input_partitions = match runtime.block_on(changelog::ensure(
        &client,
        &config.topology.input_topic,
        &config.changelog_topic,
        config.topology.retention,
    )) {
        Ok(n) => n,
        Err(e) => return fail_start(&e, exit_code(e.is_refusal())),
    };
    shared.beat_all();
    if let Some(topic) = &config.repartition_topic
        && let Err(e) = runtime.block_on(repartition::ensure(
            &client,
            &config.topology.input_topic,
            input_partitions,
            topic,
        ))
    {
        return fail_start(&e, exit_code(e.is_refusal()));
    }
    shared.beat_all();
    let mut written = vec![
        WrittenTopic {
            field: "topology.outputTopic",
            topic: config.topology.output_topic.clone(),
        },
        WrittenTopic {
            field: "topology.deadLetterTopic",
            topic: config.topology.dead_letter_topic.clone(),
        },
    ];
    if let Some(d) = &config.topology.duplicates_topic {
        written.push(WrittenTopic {
            field: "topology.duplicatesTopic",
            topic: d.clone(),
        });
    }
    if let Some(topic) = &config.repartition_topic {
        written.push(WrittenTopic {
            field: "the repartition topic",
            topic: topic.clone(),
        });
    }
    let mut client = client;
    match runtime.block_on(topics::check(
        &client,
        &written,
        config.topology.max_value_bytes,
    )) {
        // Batches larger than a topic takes would be refused as a whole.
        Ok(checked) if client.get("batch.size").is_none() => {
            let batch = topics::batch_size(checked.smallest_limit);
            client.set("batch.size", batch.to_string());
        }
        Ok(_) => {}
        Err(e) => return fail_start(&e, exit_code(e.is_refusal())),
    }
    shared.beat_all();
    let engine_config = EngineConfig::new(
        &config,
        &args.pod_name,
        input_partitions as u32,
        client,
        // The downward API's spec.nodeName, set by the operator.
        std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
    );

    let process = workers::Process {
        memory: SharedMemory::new(&engine_config.rocksdb, config.group.standby_replicas > 0),
        shared,
        metrics,
    };
    let code = match workers::run(&engine_config, &process, Faults::from_env()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("streamapp-processor: {e}");
            ExitCode::from(match e {
                EngineError::Fenced { .. } => EXIT_FENCED,
                EngineError::TopicUnusable { .. } => EXIT_CONFIG,
                _ => EXIT_FAILED,
            })
        }
    };
    // Let the drain request that may be waiting get its answer out.
    std::thread::sleep(Duration::from_millis(300));
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
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
