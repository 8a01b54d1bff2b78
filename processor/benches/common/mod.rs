//! What the two benchmarks share: the input workload, the processor and peer processes, and
//! how throughput, latency, CPU and memory are measured. `dedup_vs_copy` and
//! `vs_kafka_streams` each use part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod reference;
mod system;
mod workload;

pub use system::*;
pub use workload::*;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use testbed::kafka::{self, Isolation};
use testbed::process::free_port;

/// The reference systems (skeleton, copy) run as children of this program: on the processor's
/// allocator, so that the floor they measure is not raised by a slower one.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub const PROCESSOR_BIN: &str = env!("CARGO_BIN_EXE_streamapp-processor");
pub const PARTITIONS: i32 = 4;
/// Every system commits every 100 ms (the processor's default, Kafka Streams' EOS default).
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
pub const DUPLICATE_FRACTION: f64 = 0.30;
pub const RECORD_BYTES: usize = 200;
/// The dedup retention every system is given.
pub const RETENTION: Duration = Duration::from_secs(3600);
pub const LATENCY_WARMUP: Duration = Duration::from_secs(3);
/// A phase that makes no progress for this long is stuck, not slow: the run fails.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs a benchmark with a runtime and a topic registry, deletes every topic it created
/// whatever the outcome (a run writes gigabytes), and turns its verdict into the exit code.
pub fn run(bench: impl FnOnce(&tokio::runtime::Runtime, &mut Topics<'_>) -> bool) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut topics = Topics {
        runtime: &runtime,
        created: Vec::new(),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bench(&runtime, &mut topics)
    }));
    // A failed run keeps its topics, as it keeps its work dir: they are what to look into.
    if matches!(result, Ok(true)) {
        topics.delete_all();
    } else {
        println!("topics kept: {}", topics.created.join(" "));
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A number from the environment, or its default.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

/// What one system achieved.
#[derive(Clone, Copy, Default)]
pub struct Figures {
    pub records_per_s: f64,
    pub cpu_s_per_million: f64,
    pub peak_rss_mib: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

// ---- the processor ------------------------------------------------------------------------------

/// The processor's producer `linger.ms` (its default): what every system's producer gets
/// unless a sweep (`BENCH_LINGERS`) says otherwise.
pub const LINGER_MS: u32 = 5;

/// What the processor's RocksDB write-ahead log does (`rocksdb.wal`): the durability a store
/// gets per commit, measured next to what Kafka Streams runs (RocksDB without a WAL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wal {
    /// The default: a WAL, written with each applied commit, not synced to disk.
    #[default]
    Default,
    /// `syncOnCommit: true`: an fsync of the WAL with each applied commit.
    SyncOnCommit,
    /// `enabled: false`: no WAL, as Kafka Streams runs RocksDB.
    Off,
}

/// What a benchmark sets in an application's configuration (the processor's, or the same
/// settings of a peer).
#[derive(Clone, Copy)]
pub struct AppOptions {
    /// `topology.repartition`: `Auto` (the input is not keyed by the id: re-key through the
    /// repartition topic) or `Never` (it is).
    pub repartition: bool,
    pub retention: Duration,
    /// `group.standbyReplicas`: copies of each task's store kept on other instances.
    pub standby_replicas: u32,
    /// The group's `session.timeout.ms` (and a heartbeat a third of it); the client's
    /// default when `None`.
    pub session_timeout: Option<Duration>,
    /// Partitions of the application's own topics (its input's count).
    pub partitions: i32,
    /// `processingThreads` of each processor process.
    pub processing_threads: u32,
    /// The producer's `linger.ms` (every system's, Kafka Streams at its defaults excepted).
    pub linger_ms: u32,
    /// The processor's WAL (the processor only).
    pub wal: Wal,
}

impl AppOptions {
    /// An input keyed by the id, the default retention: no repartition stage.
    pub fn keyed_by_id() -> Self {
        AppOptions {
            repartition: false,
            retention: RETENTION,
            standby_replicas: 0,
            session_timeout: None,
            partitions: PARTITIONS,
            processing_threads: 1,
            linger_ms: LINGER_MS,
            wal: Wal::Default,
        }
    }

    /// The librdkafka properties of the group's timing, when set.
    pub fn group_properties(&self) -> Vec<(String, String)> {
        self.session_timeout
            .map(|t| {
                vec![
                    ("session.timeout.ms".into(), t.as_millis().to_string()),
                    (
                        "heartbeat.interval.ms".into(),
                        (t / 3).as_millis().to_string(),
                    ),
                ]
            })
            .unwrap_or_default()
    }
}

/// Topics and configuration of one streamapp-processor application.
pub struct DedupApp {
    pub id: String,
    pub input: String,
    pub output: String,
    pub duplicates: String,
    /// The internal topic of the repartition stage, when there is one.
    pub repartition: Option<String>,
    pub dir: PathBuf,
}

impl DedupApp {
    pub fn create(
        topics: &mut Topics<'_>,
        work: &Path,
        id: &str,
        input: &str,
        options: &AppOptions,
    ) -> DedupApp {
        let (output, duplicates, dead_letters) = (
            format!("{id}-out"),
            format!("{id}-dups"),
            format!("{id}-dlq"),
        );
        topics.create_with(&[&output, &duplicates, &dead_letters], options.partitions);
        // The processor creates its changelog; listed here so that it is deleted at the end.
        topics.created.push(format!("{id}-dedup-changelog"));
        let repartition = options
            .repartition
            .then(|| format!("{id}-dedup-repartition"));
        topics.created.extend(repartition.clone());
        let mut properties = system_properties();
        properties.extend(options.group_properties());
        properties.insert("linger.ms".into(), options.linger_ms.to_string());
        let mut rocksdb = match options.wal {
            Wal::Default => serde_json::json!({}),
            Wal::SyncOnCommit => serde_json::json!({ "wal": { "syncOnCommit": true } }),
            Wal::Off => serde_json::json!({ "wal": { "enabled": false } }),
        };
        rocksdb.as_object_mut().unwrap().extend(system_rocksdb());
        let config = serde_json::json!({
            "applicationId": id,
            "kafka": { "bootstrapServers": kafka::bootstrap(), "properties": properties },
            "topology": {
                "inputTopic": input,
                "outputTopic": output,
                "duplicatesTopic": duplicates,
                "deadLetterTopic": dead_letters,
                // "JSON with an id": the id is read from the value, as users configure it.
                "dedupId": { "source": "JsonPointer", "jsonPointer": "/id" },
                "repartition": if options.repartition { "Auto" } else { "Never" },
                "retention": format!("{}ms", options.retention.as_millis()),
                // Must stay under the retention (the benchmarks' record times are never ahead
                // of the clock, so it changes nothing else): the default 5m, or a quarter of a
                // shortened retention.
                "maxSkew": format!("{}ms", (options.retention / 4).min(Duration::from_secs(300)).as_millis()),
                "commitInterval": format!("{}ms", COMMIT_INTERVAL.as_millis()),
            },
            // The default RocksDB profile (what a StreamApp gets unless tuned), the WAL aside.
            "rocksdb": rocksdb,
            "group": { "standbyReplicas": options.standby_replicas },
            "processingThreads": options.processing_threads,
        });
        let dir = work.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("processor.yaml"),
            serde_yaml::to_string(&config).unwrap(),
        )
        .unwrap();
        DedupApp {
            id: id.into(),
            input: input.into(),
            output,
            duplicates,
            repartition,
            dir,
        }
    }

    /// Starts the processor the way the integration tests do (and a pod does), as instance
    /// (pod) [`SINGLE_INSTANCE`].
    pub fn start(&self) -> System {
        self.start_instance(SINGLE_INSTANCE)
    }

    /// Starts instance `instance` of the application: the pod of that name, with a state
    /// directory and log of its own. A restart (same instance) reuses its state and appends to
    /// its log.
    pub fn start_instance(&self, instance: &str) -> System {
        let port = free_port();
        let dir = instance_dir(&self.dir, instance);
        let log = dir.join("processor.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let log_start = log_file.metadata().map_or(0, |m| m.len());
        // BENCH_PROCESSOR_BIN: another build of the processor (a copy, so that rebuilding
        // the workspace during a long run does not change the binary mid-run).
        let bin = std::env::var("BENCH_PROCESSOR_BIN").unwrap_or_else(|_| PROCESSOR_BIN.into());
        let child = system_command(bin)
            .arg("run")
            .env("STREAMAPP_CONFIG", self.dir.join("processor.yaml"))
            .env("POD_NAME", instance)
            .env("STREAMAPP_STATE_DIR", dir.join("state"))
            .env("STREAMAPP_HTTP_PORT", port.to_string())
            // BENCH_PROCESSOR_LOG: the processor's RUST_LOG, to look into a run (with e.g.
            // BENCH_SYSTEM_PROPS=debug=eos and librdkafka=debug).
            .env(
                "RUST_LOG",
                std::env::var("BENCH_PROCESSOR_LOG").unwrap_or("info,librdkafka=warn".into()),
            )
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting streamapp-processor");
        System {
            name: format!("streamapp {instance}"),
            child,
            group: self.id.clone(),
            input: self.input.clone(),
            repartition: self.repartition.clone(),
            kind: Kind::Processor { port },
            log,
            log_start,
            tasks_file: None,
        }
    }
}

/// The instance name (pod name, `group.instance.id`) of an application run as one process.
pub const SINGLE_INSTANCE: &str = "bench-0";

/// Where instance `instance` of the application in `app_dir` keeps its state and log (created).
pub fn instance_dir(app_dir: &Path, instance: &str) -> PathBuf {
    let dir = app_dir.join(instance);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---- measurements ------------------------------------------------------------------------------

/// The processor's own view: counts, transactions and the mean time a commit takes.
pub fn print_processor_metrics(system: &System) {
    let m = system.processor_metrics();
    let commits = m("commit_seconds_count");
    println!(
        "  processor metrics: records_in {} records_out {} duplicates {}; transactions: {} committed, {} aborted, mean commit {:.1} ms",
        m("records_in_total"),
        m("records_out_total"),
        m("duplicates_total"),
        m("transactions_committed_total"),
        m("transactions_aborted_total"),
        1000.0 * m("commit_seconds_sum") / commits
    );
}

/// Records/s, CPU and peak RSS of `system` consuming `total` records that are already in its
/// input. The window runs from the moment it is ready (partitions assigned, stores restored:
/// start-up and group join are left out) to the commit of the last record, seen through the
/// group's committed offsets, sampled every 50 ms.
pub fn measure_throughput(system: &mut System, total: u64) -> Figures {
    let watcher = system.offsets_watcher();
    let pid = system.child.id();
    system.wait_ready();
    let (start, start_cpu) = (Instant::now(), cpu_seconds(pid));
    system.wait_done(&watcher, total);
    let (seconds, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds(pid) - start_cpu);
    let fig = Figures {
        records_per_s: total as f64 / seconds,
        cpu_s_per_million: cpu / total as f64 * 1e6,
        peak_rss_mib: peak_rss_mib(pid),
        ..Default::default()
    };
    println!(
        "{}: {total} records in {seconds:.1} s = {:.0} records/s; {cpu:.1} CPU s; peak RSS {:.0} MiB",
        system.name, fig.records_per_s, fig.peak_rss_mib
    );
    fig
}

/// p50/p99 end-to-end latency of `system` at `rate` records/s for `duration` after the
/// warm-up: records are sent at the rate with their send time, the output is read with
/// read_committed as it is committed, and each output record's latency is its receive time −
/// its send time. Records sent in the warm-up are left out. `dedups` says whether the system
/// emits each id once (a dedup) or every record (a copy).
pub fn measure_latency(
    fig: &mut Figures,
    system: &System,
    output: &str,
    rate: u64,
    duration: Duration,
    dedups: bool,
) {
    let receiver = Receiver::start(output, None);
    let producer: BaseProducer = kafka::input_producer_config()
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    let mut workload = Workload::new().recent(rate * RETENTION.as_secs() / 2);
    let warmup_end_us = now_us() + LATENCY_WARMUP.as_micros() as i64;
    let sent = send_paced(
        &producer,
        &system.input,
        &mut workload,
        rate,
        LATENCY_WARMUP + duration,
        |_| {},
    );
    producer
        .flush(Duration::from_secs(30))
        .expect("flushing the latency input");
    // A copy outputs every record, a dedup every first occurrence.
    let expected = if dedups { workload.distinct } else { sent } as usize;
    let mut latencies_us = receiver.finish(expected, warmup_end_us);
    latencies_us.sort_unstable();
    fig.p50_ms = percentile(&latencies_us, 0.50) / 1000.0;
    fig.p99_ms = percentile(&latencies_us, 0.99) / 1000.0;
    println!(
        "{}: {sent} records sent, {} output records measured: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        system.name,
        latencies_us.len(),
        fig.p50_ms,
        fig.p99_ms,
        latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0
    );
}

/// Reads an output topic under read_committed in a thread, noting each record's send time and
/// receive time.
pub struct Receiver {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<Vec<(i64, i64)>>,
}

impl Receiver {
    /// Reads `topic` from the beginning, or from `from` (one offset per partition).
    pub fn start(topic: &str, from: Option<&[i64]>) -> Receiver {
        let consumer: BaseConsumer = kafka::client_config()
            .set("group.id", testbed::unique_name("bench-receiver"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            // Fetch as soon as anything is committed: the reader must not add latency of its own.
            .set("fetch.wait.max.ms", "10")
            .create()
            .expect("receiver");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            let offset = from.map_or(Offset::Beginning, |f| Offset::Offset(f[p as usize]));
            tpl.add_partition_offset(topic, p, offset).unwrap();
        }
        consumer.assign(&tpl).expect("assign");
        let (stop, received) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (stop_flag, count) = (stop.clone(), received.clone());
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop_flag.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(20)) {
                    Some(Ok(m)) => {
                        let received_at = now_us();
                        if let Some(sent) = m.payload().and_then(sent_us) {
                            seen.push((sent, received_at));
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Err(e)) => eprintln!("receiver: {e}"),
                    None => {}
                }
            }
            seen
        });
        Receiver {
            stop,
            received,
            thread,
        }
    }

    /// Records received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::Relaxed)
    }

    /// Stops reading; returns (send time, receive time) in µs of every record received.
    pub fn stop(self) -> Vec<(i64, i64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("receiver thread")
    }

    /// Waits (30 s at most) until `expected` records arrived; returns the latencies in µs of
    /// those sent at or after `from_us`.
    pub fn finish(self, expected: usize, from_us: i64) -> Vec<i64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.received() < expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let records = self.stop();
        if records.len() != expected {
            println!(
                "  warning: {} output records arrived, {expected} expected",
                records.len()
            );
        }
        records
            .into_iter()
            .filter(|&(sent, _)| sent >= from_us)
            .map(|(sent, received)| received - sent)
            .collect()
    }
}

pub fn percentile(sorted: &[i64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// What an output check found: whether every id was there exactly once, and the line that
/// says what the output held (printed as it is checked, and again in a run's closing summary
/// when it is wrong: the end of a long run's output is what a CI log keeps).
pub struct OutputCheck {
    pub correct: bool,
    pub line: String,
}

/// Checks a dedup system's committed output against the input: every distinct id exactly once
/// in `output`, nothing else, and every repeat in `duplicates`. The id is the one in the value
/// (a system may key its output by the id or keep the input's key). Prints what it found.
pub fn check_dedup_output(
    name: &str,
    output: &str,
    duplicates: &str,
    dataset: &Dataset,
) -> OutputCheck {
    let mut ids = HashSet::new();
    let mut unknown = 0u64;
    let records = kafka::read_all(output, Isolation::ReadCommitted, |m| {
        let id = m.payload().and_then(id_of).unwrap_or_default().to_vec();
        if !dataset.ids.contains(&id) {
            unknown += 1;
        }
        ids.insert(id);
    });
    let missing = dataset.ids.iter().filter(|id| !ids.contains(*id)).count();
    let dups = kafka::read_all(duplicates, Isolation::ReadCommitted, |_| {});
    let expected_dups = (dataset.records - dataset.distinct) as usize;
    let correct = records == ids.len()
        && unknown == 0
        && ids.len() as u64 == dataset.distinct
        && dups == expected_dups;
    let line = format!(
        "{name} output: {records} records, {} distinct ids, {unknown} not in the input, {missing} of the input's missing (input has {} distinct); \
         duplicates topic: {dups} (expected {expected_dups}) — each id exactly once: {}",
        ids.len(),
        dataset.distinct,
        if correct { "yes" } else { "NO" }
    );
    println!("{line}");
    OutputCheck { correct, line }
}

/// Extra librdkafka properties for the Rust systems' clients (`BENCH_SYSTEM_PROPS="k=v,k=v"`),
/// to see how a client setting moves the figures; none by default.
pub fn system_properties() -> std::collections::BTreeMap<String, String> {
    std::env::var("BENCH_SYSTEM_PROPS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// More of the processor's `rocksdb` section (`BENCH_ROCKSDB`, a JSON object, e.g.
/// `{"compactionStyle": "Universal"}`), to measure a tuning against the defaults. Its top-level
/// keys replace the run's own (`wal` for the WAL variants).
pub fn system_rocksdb() -> serde_json::Map<String, serde_json::Value> {
    std::env::var("BENCH_ROCKSDB").map_or_else(
        |_| serde_json::Map::new(),
        |extra| {
            serde_json::from_str(&extra)
                .unwrap_or_else(|e| panic!("BENCH_ROCKSDB is not a JSON object: {e}"))
        },
    )
}

// ---- small helpers -------------------------------------------------------------------------

/// Creates topics ([`PARTITIONS`] unless told) and remembers them for deletion.
pub struct Topics<'a> {
    pub runtime: &'a tokio::runtime::Runtime,
    pub created: Vec<String>,
}

impl Topics<'_> {
    pub fn create(&mut self, names: &[&str]) {
        self.create_with(names, PARTITIONS);
    }

    /// Creates topics of `partitions` partitions.
    pub fn create_with(&mut self, names: &[&str], partitions: i32) {
        for name in names {
            self.runtime.block_on(kafka::create_topic(name, partitions));
            self.created.push((*name).to_string());
        }
        // A broker that has just started can answer for a moment as if a topic it created did
        // not exist, and a processor started then refuses to run without its input topic.
        for name in names {
            let deadline = Instant::now() + Duration::from_secs(30);
            while kafka::partition_count(name) != partitions {
                assert!(
                    Instant::now() < deadline,
                    "topic {name}: the broker does not list its {partitions} partitions 30 s after creating it"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Deletes these topics (of those created or listed), now.
    pub fn delete(&mut self, names: &[String]) {
        let (gone, kept) = self.created.drain(..).partition(|t| names.contains(t));
        self.created = kept;
        let mut gone = Topics {
            runtime: self.runtime,
            created: gone,
        };
        gone.delete_all();
    }

    /// Deletes every topic created (or listed) so far.
    pub fn delete_all(&mut self) {
        if self.created.is_empty() {
            return;
        }
        let admin: AdminClient<DefaultClientContext> =
            kafka::client_config().create().expect("admin client");
        let names: Vec<&str> = self.created.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        match self.runtime.block_on(admin.delete_topics(&names, &opts)) {
            Ok(results) => {
                for r in results {
                    if let Err((topic, code)) = r {
                        // A changelog the system never created is not an error worth a line.
                        if code != rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition {
                            eprintln!("deleting topic {topic}: {code}");
                        }
                    }
                }
            }
            Err(e) => eprintln!("deleting the benchmark's topics: {e}"),
        }
        self.created.clear();
    }
}

/// An HTTP call to a processor on 127.0.0.1: (status, body).
pub fn http(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    streamapp_api::probe::call(addr, method, path, Duration::from_secs(60))
        .ok()
        .map(|r| (r.status, r.body))
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// utime + stime of a process (all its threads), in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces): state is the first, utime the
    // 12th and stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    ticks as f64 / clock_ticks_per_second()
}

/// The CPU each system under test is pinned to (`BENCH_SYSTEM_CPU`; `make bench-compare` with
/// `BENCH_PIN=1` sets it and puts the broker and this driver on the other cores), if any.
pub fn system_cpu() -> Option<String> {
    std::env::var("BENCH_SYSTEM_CPU")
        .ok()
        .filter(|cpu| !cpu.is_empty())
}

/// Set by [`unpin_systems`]: systems started from then on run on every CPU.
static SYSTEMS_UNPINNED: AtomicBool = AtomicBool::new(false);

/// From here on, systems under test are not pinned to [`system_cpu`] but run on every CPU of
/// the machine (the scaling phase: processes pinned to one CPU would only share it). The broker
/// keeps its own pinning.
pub fn unpin_systems() {
    SYSTEMS_UNPINNED.store(true, Ordering::Relaxed);
}

/// The command that starts a system under test: on its own CPU when [`system_cpu`] says so
/// (`taskset` execs the program, so the child's pid, CPU time and memory are the system's);
/// after [`unpin_systems`], on every CPU (named: a pinned driver's children would inherit its
/// own CPUs).
pub fn system_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let cpus = match system_cpu() {
        Some(_) if SYSTEMS_UNPINNED.load(Ordering::Relaxed) => {
            Some(format!("0-{}", cores().saturating_sub(1)))
        }
        cpu => cpu,
    };
    match cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpus).arg(program);
            command
        }
        None => Command::new(program),
    }
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// VmHWM: the peak resident set size of a process so far.
pub fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The machine's CPUs (what "machine busy" is a share of).
pub fn cores() -> usize {
    // The machine's, not this process's: a pinned driver (BENCH_PIN) may run on one of them.
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    if cpus > 0 {
        cpus
    } else {
        std::thread::available_parallelism().map_or(0, usize::from)
    }
}

/// How many partitions `topic` has: asked once per topic (a benchmark never changes it); a
/// topic not there yet has none and is asked again.
pub fn partitions_of(topic: &str) -> i32 {
    static KNOWN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, i32>>> =
        std::sync::OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    if let Some(&n) = known.lock().unwrap().get(topic) {
        return n;
    }
    let n = kafka::partition_count(topic);
    if n > 0 {
        known.lock().unwrap().insert(topic.to_string(), n);
    }
    n
}

pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The last `max` warnings and errors of a system's log, indented: what a wrong output's
/// summary shows of the system that wrote it.
pub fn log_warnings(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        // librdkafka's notes on a property meant for the other client kind are not news.
        .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && !l.contains("CONFWARN"))
        .collect();
    let shown = &lines[lines.len().saturating_sub(max)..];
    format!(
        "{} ({} warnings and errors, the last {} shown):\n{}",
        path.display(),
        lines.len(),
        shown.len(),
        shown
            .iter()
            .map(|l| format!("      {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}
