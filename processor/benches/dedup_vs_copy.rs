//! Benchmark: the EOS dedup topology (the real `streamapp-processor` binary) next to a plain
//! transactional copy (consume → produce, same commit interval, no store), measured in the same
//! run on the local broker. It prints figures and the ratios dedup/copy; it asserts nothing
//! about speed (a ratio against a peer measured on the same machine at the same time means
//! something on a busy 2-core box; an absolute threshold does not).
//!
//! Run it with `make bench` (the broker must be up: `make up`), or
//! `CARGO_TARGET_DIR=~/.cache/streamapp/target cargo bench -p streamapp-processor --bench dedup_vs_copy`.
//! Smaller runs: `BENCH_RECORDS`, `BENCH_LATENCY_RATE`, `BENCH_LATENCY_SECONDS`.
//!
//! What one run does:
//! 1. Produces the input once: `BENCH_RECORDS` (default 1,000,000) JSON records of 200 B, 4
//!    partitions, about 30% repeating an earlier id (key = id, so repeats share a partition).
//! 2. Throughput: the processor (one process, commit interval 100 ms) consumes all of it; then
//!    the copy consumes the same topic under its own consumer group. Each runs in a process of
//!    its own so that RSS and CPU are its own: the copy is this program re-executed with
//!    `copy`. Progress is watched the same way for both, through the group's committed offsets.
//! 3. Correctness of the dedup output: each id exactly once.
//! 4. Latency at a fixed load well below both maximums (`BENCH_LATENCY_RATE` records/s, default
//!    2,000 — a quarter of the processor's throughput on the 2-core dev machine — for `BENCH_LATENCY_SECONDS`, default 20, after a 3 s warm-up, the same 30%
//!    repeats), each system on fresh topics: receive time of the output record under
//!    read_committed − send time of the input record.
//! 5. A table and the ratios dedup/copy; the load average at start and end. The topics are
//!    deleted at the end (a run writes about 1 GB to the broker).

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
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use testbed::kafka::{self, Isolation};

const PROCESSOR_BIN: &str = env!("CARGO_BIN_EXE_streamapp-processor");
const PARTITIONS: i32 = 4;
/// Both systems commit every 100 ms (the processor's default, Kafka Streams' EOS default).
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
const DUPLICATE_FRACTION: f64 = 0.30;
const RECORD_BYTES: usize = 200;
const LATENCY_WARMUP: Duration = Duration::from_secs(3);
/// A phase that makes no progress for this long is stuck, not slow: the run fails.
const STALL_TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; the copy child is started as `<self> copy <args>`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.first().map(String::as_str) == Some("copy") {
        copy::run(&args[1..]);
        return ExitCode::SUCCESS;
    }
    let settings = Settings::from_env();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut topics = Topics {
        runtime: &runtime,
        created: Vec::new(),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bench(&settings, &mut topics)
    }));
    // Delete the run's topics whatever the outcome: they hold about 1 GB.
    topics.delete_all();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

struct Settings {
    records: u64,
    latency_rate: u64,
    latency_duration: Duration,
}

impl Settings {
    fn from_env() -> Self {
        let num = |name: &str, default: u64| -> u64 {
            std::env::var(name).ok().map_or(default, |v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
            })
        };
        Settings {
            records: num("BENCH_RECORDS", 1_000_000),
            latency_rate: num("BENCH_LATENCY_RATE", 2_000),
            latency_duration: Duration::from_secs(num("BENCH_LATENCY_SECONDS", 20)),
        }
    }
}

/// What one system achieved.
#[derive(Default)]
struct Figures {
    records_per_s: f64,
    cpu_s_per_million: f64,
    peak_rss_mib: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// The whole run. Returns whether the dedup output was correct.
fn bench(settings: &Settings, topics: &mut Topics<'_>) -> bool {
    println!(
        "dedup vs transactional copy: {} records, {PARTITIONS} partitions, commit interval {COMMIT_INTERVAL:?}, broker {}",
        settings.records,
        kafka::bootstrap()
    );
    println!(
        "machine: {} cores; load average at start: {}",
        cores(),
        loadavg()
    );
    let work = tempfile::Builder::new()
        .prefix("streamapp-bench-")
        .tempdir()
        .expect("temp dir");
    let run = testbed::unique_name("bench");

    // ---- the input, produced once for both systems ---------------------------------------
    let input = format!("{run}-in");
    topics.create(&[&input]);
    let started = Instant::now();
    let dataset = produce_dataset(&input, settings.records);
    let repeats = dataset.records - dataset.distinct;
    println!(
        "input: {} records, {} distinct ids, {repeats} repeats ({:.1}%), {:.0} B values on average, produced in {:.1} s",
        dataset.records,
        dataset.distinct,
        100.0 * repeats as f64 / dataset.records as f64,
        dataset.value_bytes as f64 / dataset.records as f64,
        started.elapsed().as_secs_f64()
    );

    // ---- throughput: one system after the other, on the same input ------------------------
    let dedup_app = DedupApp::create(topics, work.path(), &format!("{run}-dedup"), &input);
    let mut dedup = dedup_app.start();
    let mut dedup_fig = measure_throughput(&mut dedup, settings.records);
    print_processor_metrics(&dedup);
    dedup.stop();

    let copy_output = format!("{run}-copy-out");
    topics.create(&[&copy_output]);
    let mut copy = start_copy(work.path(), &format!("{run}-copy"), &input, &copy_output);
    let mut copy_fig = measure_throughput(&mut copy, settings.records);
    copy.stop_and_report();

    // ---- correctness of what was measured --------------------------------------------------
    let correct = check_dedup_output(&dedup_app, &dataset);
    let copied = kafka::read_all(&copy_output, Isolation::ReadCommitted, |_| {});
    println!(
        "copy output: {copied} records (expected {})",
        dataset.records
    );

    // ---- latency at a fixed load, fresh topics per system -----------------------------------
    println!(
        "latency: {} records/s for {:?} after a {LATENCY_WARMUP:?} warm-up (30% repeats), per system on fresh topics",
        settings.latency_rate, settings.latency_duration
    );
    let lat_input = format!("{run}-lat-dedup-in");
    topics.create(&[&lat_input]);
    let lat_app = DedupApp::create(topics, work.path(), &format!("{run}-lat-dedup"), &lat_input);
    let mut lat_dedup = lat_app.start();
    lat_dedup.wait_ready();
    measure_latency(&mut dedup_fig, &lat_dedup, &lat_app.output, settings);
    print_processor_metrics(&lat_dedup);
    lat_dedup.stop();

    let (lat_input, lat_output) = (format!("{run}-lat-copy-in"), format!("{run}-lat-copy-out"));
    topics.create(&[&lat_input, &lat_output]);
    let mut lat_copy = start_copy(
        work.path(),
        &format!("{run}-lat-copy"),
        &lat_input,
        &lat_output,
    );
    lat_copy.wait_ready();
    measure_latency(&mut copy_fig, &lat_copy, &lat_output, settings);
    lat_copy.stop_and_report();

    print_table(&dedup_fig, &copy_fig);
    println!("load average at end: {}", loadavg());
    if !correct {
        println!(
            "THE DEDUP OUTPUT WAS NOT CORRECT: the figures above do not describe a working processor"
        );
    }
    correct
}

// ---- the input data ------------------------------------------------------------------------

/// A small deterministic PRNG (SplitMix64): every run uses the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Generates the records: with probability 0.3 a record repeats an id drawn uniformly from the
/// ids issued so far (so repeats come both right after and long after the first occurrence).
struct Workload {
    rng: Rng,
    distinct: u64,
    seq: u64,
}

impl Workload {
    fn new() -> Self {
        Workload {
            rng: Rng(42),
            distinct: 0,
            seq: 0,
        }
    }

    /// The next record: key = id, and a 200 B JSON value that carries the send time in µs
    /// (the record timestamp carries it in ms; the µs make the latency figures finer).
    fn next(&mut self, sent_us: i64) -> (String, String) {
        let n = if self.distinct > 0 && self.rng.unit() < DUPLICATE_FRACTION {
            self.rng.next() % self.distinct
        } else {
            self.distinct += 1;
            self.distinct - 1
        };
        let id = format!("cmd-{n:010}");
        let head = format!(
            r#"{{"id":"{id}","seq":{},"sentUs":{sent_us},"payload":""#,
            self.seq
        );
        self.seq += 1;
        let pad = RECORD_BYTES.saturating_sub(head.len() + 2);
        (id, format!("{head}{}\"}}", "x".repeat(pad)))
    }
}

/// The send time a value carries (see [`Workload::next`]).
fn sent_us(value: &[u8]) -> Option<i64> {
    const FIELD: &[u8] = b"\"sentUs\":";
    let at = value.windows(FIELD.len()).position(|w| w == FIELD)? + FIELD.len();
    let digits = value[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&value[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

struct Dataset {
    records: u64,
    distinct: u64,
    value_bytes: u64,
}

/// Produces the throughput input as fast as the broker takes it.
fn produce_dataset(topic: &str, records: u64) -> Dataset {
    let producer: BaseProducer = kafka::client_config()
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .expect("producer");
    let mut workload = Workload::new();
    let mut value_bytes = 0;
    for _ in 0..records {
        let (key, value) = workload.next(now_us());
        value_bytes += value.len() as u64;
        testbed::kafka::send(
            &producer,
            BaseRecord::to(topic)
                .key(key.as_bytes())
                .payload(value.as_bytes())
                .timestamp(now_us() / 1000),
        );
    }
    producer
        .flush(Duration::from_secs(120))
        .expect("flushing the input");
    Dataset {
        records,
        distinct: workload.distinct,
        value_bytes,
    }
}

// ---- the two systems -------------------------------------------------------------------------

/// Topics and configuration of one processor application.
struct DedupApp {
    id: String,
    input: String,
    output: String,
    duplicates: String,
    dir: PathBuf,
}

impl DedupApp {
    fn create(topics: &mut Topics<'_>, work: &Path, id: &str, input: &str) -> DedupApp {
        let (output, duplicates, dead_letters) = (
            format!("{id}-out"),
            format!("{id}-dups"),
            format!("{id}-dlq"),
        );
        topics.create(&[&output, &duplicates, &dead_letters]);
        // The processor creates its changelog; listed here so that it is deleted at the end.
        topics.created.push(format!("{id}-dedup-changelog"));
        let config = serde_json::json!({
            "applicationId": id,
            "kafka": { "bootstrapServers": kafka::bootstrap(), "properties": system_properties() },
            "topology": {
                "inputTopic": input,
                "outputTopic": output,
                "duplicatesTopic": duplicates,
                "deadLetterTopic": dead_letters,
                // "JSON with an id": the id is read from the value, as users configure it.
                "dedupId": { "source": "JsonPointer", "jsonPointer": "/id" },
                "retention": "1h",
                "commitInterval": format!("{}ms", COMMIT_INTERVAL.as_millis()),
            },
            // The default RocksDB profile: what a StreamApp gets unless tuned.
            "rocksdb": {},
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
            dir,
        }
    }

    /// Starts the processor the way the integration tests do (and a pod does).
    fn start(&self) -> System {
        let port = free_port();
        let log = self.dir.join("processor.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(PROCESSOR_BIN)
            .arg("run")
            .env("STREAMAPP_CONFIG", self.dir.join("processor.yaml"))
            .env("POD_NAME", "bench-0")
            .env("STREAMAPP_STATE_DIR", self.dir.join("state"))
            .env("STREAMAPP_HTTP_PORT", port.to_string())
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting streamapp-processor");
        System {
            name: "dedup",
            child,
            group: self.id.clone(),
            input: self.input.clone(),
            kind: Kind::Processor { port },
            log,
        }
    }
}

/// Starts the copy: this program re-executed as `copy <input> <output> <group> <ready file>`.
fn start_copy(work: &Path, group: &str, input: &str, output: &str) -> System {
    let dir = work.join(group);
    std::fs::create_dir_all(&dir).unwrap();
    let (ready, log) = (dir.join("ready"), dir.join("copy.log"));
    let log_file = std::fs::File::create(&log).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["copy", input, output, group])
        .arg(&ready)
        .stdin(Stdio::piped())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .expect("starting the copy");
    System {
        name: "copy",
        child,
        group: group.into(),
        input: input.into(),
        kind: Kind::Copy { ready },
        log,
    }
}

enum Kind {
    Processor {
        port: u16,
    },
    /// The copy touches `ready` once it has its partitions, and stops (commits, exits) when its
    /// stdin closes.
    Copy {
        ready: PathBuf,
    },
}

/// A running system: a child process consuming `input` under consumer group `group`.
struct System {
    name: &'static str,
    child: Child,
    group: String,
    input: String,
    kind: Kind,
    log: PathBuf,
}

impl System {
    /// Fails the run, with the child's log, when the child exited.
    fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{} exited with {status}; its log:\n{}",
                self.name,
                log_tail(&self.log)
            );
        }
    }

    /// Waits until it consumes: the processor is ready (partitions assigned, stores restored),
    /// the copy has its partitions.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + STALL_TIMEOUT;
        loop {
            self.check_alive();
            let ready = match &self.kind {
                Kind::Processor { port } => {
                    http(*port, "GET", streamapp_api::probe::READYZ).is_some_and(|(s, _)| s == 200)
                }
                Kind::Copy { ready } => ready.exists(),
            };
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready after {STALL_TIMEOUT:?}:\n{}",
                self.name,
                log_tail(&self.log)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A client that reads the group's committed offsets (OffsetFetch) without joining it.
    fn offsets_watcher(&self) -> BaseConsumer {
        kafka::client_config()
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("offsets watcher")
    }

    /// Input records committed by the group: the sum of its committed offsets.
    fn committed(&self, watcher: &BaseConsumer) -> u64 {
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(&self.input, p);
        }
        match watcher.committed_offsets(tpl, Duration::from_secs(5)) {
            Ok(c) => c
                .elements()
                .iter()
                .map(|e| {
                    if let Offset::Offset(o) = e.offset() {
                        o as u64
                    } else {
                        0
                    }
                })
                .sum(),
            // Not known yet (e.g. an offset commit in flight): asked again on the next tick.
            Err(_) => 0,
        }
    }

    /// The processor's metrics from /metrics, by sample name without the prefix.
    fn processor_metrics(&self) -> impl Fn(&str) -> f64 + use<> {
        let Kind::Processor { port } = self.kind else {
            unreachable!("only the processor has metrics")
        };
        let text = http(port, "GET", "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        move |name: &str| {
            let prefix = format!("streamapp_processor_{name} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(f64::NAN)
        }
    }

    /// Stops the copy and prints the commit summary it logs on exit.
    fn stop_and_report(self) {
        let log = self.log.clone();
        self.stop();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().rev().find(|l| l.starts_with("transactions:")) {
            println!("  copy {line}");
        }
    }

    /// Stops it the way it stops in production: the processor drains, the copy commits its open
    /// transaction; both exit.
    fn stop(mut self) {
        match &self.kind {
            Kind::Processor { port } => {
                let _ = http(*port, "POST", streamapp_api::probe::DRAIN);
            }
            Kind::Copy { .. } => drop(self.child.stdin.take()),
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                eprintln!("{} did not stop within 60 s; killing it", self.name);
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// ---- measurements ------------------------------------------------------------------------------

/// The processor's own view: counts, transactions and the mean time a commit takes.
fn print_processor_metrics(system: &System) {
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
fn measure_throughput(system: &mut System, total: u64) -> Figures {
    let watcher = system.offsets_watcher();
    let pid = system.child.id();
    system.wait_ready();
    let (start, start_cpu) = (Instant::now(), cpu_seconds(pid));
    let mut last_progress = (Instant::now(), 0);
    loop {
        system.check_alive();
        let done = system.committed(&watcher);
        if done >= total {
            break;
        }
        if done > last_progress.1 {
            last_progress = (Instant::now(), done);
        }
        assert!(
            last_progress.0.elapsed() < STALL_TIMEOUT,
            "{} made no progress for {STALL_TIMEOUT:?} at {done}/{total}:\n{}",
            system.name,
            log_tail(&system.log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// p50/p99 end-to-end latency of `system` at the fixed load: records are sent at the rate with
/// their send time, the output is read with read_committed as it is committed, and each output
/// record's latency is its receive time − its send time. Records sent in the warm-up are left
/// out.
fn measure_latency(fig: &mut Figures, system: &System, output: &str, settings: &Settings) {
    let receiver = Receiver::start(output);
    let producer: BaseProducer = kafka::client_config()
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    let mut workload = Workload::new();
    let start = Instant::now();
    let warmup_end_us = now_us() + LATENCY_WARMUP.as_micros() as i64;
    let total = LATENCY_WARMUP + settings.latency_duration;
    let mut sent: u64 = 0;
    while start.elapsed() < total {
        // Paced by the clock: every record is sent at its due time, not in bursts per second.
        let due = (start.elapsed().as_secs_f64() * settings.latency_rate as f64) as u64;
        while sent < due {
            let sent_at = now_us();
            let (key, value) = workload.next(sent_at);
            testbed::kafka::send(
                &producer,
                BaseRecord::to(&system.input)
                    .key(key.as_bytes())
                    .payload(value.as_bytes())
                    .timestamp(sent_at / 1000),
            );
            sent += 1;
        }
        producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("flushing the latency input");
    // The copy outputs every record, the dedup every first occurrence.
    let expected = if matches!(system.kind, Kind::Processor { .. }) {
        workload.distinct
    } else {
        sent
    } as usize;
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
struct Receiver {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<Vec<(i64, i64)>>,
}

impl Receiver {
    fn start(topic: &str) -> Receiver {
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
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
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

    /// Waits (30 s at most) until `expected` records arrived; returns the latencies in µs of
    /// those sent at or after `from_us`.
    fn finish(self, expected: usize, from_us: i64) -> Vec<i64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop.store(true, Ordering::Relaxed);
        let records = self.thread.join().expect("receiver thread");
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

fn percentile(sorted: &[i64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// Every id exactly once in the output, and the rest in the duplicates topic.
fn check_dedup_output(app: &DedupApp, dataset: &Dataset) -> bool {
    let mut ids = HashSet::new();
    let output = kafka::read_all(&app.output, Isolation::ReadCommitted, |m| {
        ids.insert(m.key().map(<[u8]>::to_vec).unwrap_or_default());
    });
    let duplicates = kafka::read_all(&app.duplicates, Isolation::ReadCommitted, |_| {});
    let expected_dups = (dataset.records - dataset.distinct) as usize;
    let correct =
        output == ids.len() && ids.len() as u64 == dataset.distinct && duplicates == expected_dups;
    println!(
        "dedup output: {output} records, {} distinct ids (input has {}); duplicates topic: {duplicates} (expected {expected_dups}) — \
         each id exactly once: {}",
        ids.len(),
        dataset.distinct,
        if correct { "yes" } else { "NO" }
    );
    correct
}

fn print_table(dedup: &Figures, copy: &Figures) {
    println!();
    println!(
        "{:<12} {:>10} {:>11} {:>8} {:>8} {:>13}",
        "system", "records/s", "CPU s / 1M", "p50 ms", "p99 ms", "peak RSS MiB"
    );
    for (name, f) in [("dedup", dedup), ("copy", copy)] {
        println!(
            "{name:<12} {:>10.0} {:>11.1} {:>8.1} {:>8.1} {:>13.0}",
            f.records_per_s, f.cpu_s_per_million, f.p50_ms, f.p99_ms, f.peak_rss_mib
        );
    }
    println!(
        "{:<12} {:>10.2} {:>11.2} {:>8.2} {:>8.2} {:>13.2}",
        "dedup/copy",
        dedup.records_per_s / copy.records_per_s,
        dedup.cpu_s_per_million / copy.cpu_s_per_million,
        dedup.p50_ms / copy.p50_ms,
        dedup.p99_ms / copy.p99_ms,
        dedup.peak_rss_mib / copy.peak_rss_mib
    );
    println!();
}

// ---- the copy: consume → produce in transactions, nothing else -----------------------------------

mod copy {
    use super::*;

    /// `copy <input> <output> <group> <ready file>`: copies `input` to `output` exactly once,
    /// with the processor's client settings and commit interval, until stdin closes.
    pub fn run(args: &[String]) {
        let [input, output, group, ready] = args else {
            panic!("usage: dedup_vs_copy copy <input> <output> <group> <ready file>");
        };
        // The processor's consumer and producer settings (engine.rs), so that only the topology
        // differs.
        let mut client = kafka::client_config();
        for (k, v) in system_properties() {
            client.set(k, v);
        }
        let consumer: BaseConsumer = client
            .clone()
            .set("group.id", group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "range")
            .set("queued.max.messages.kbytes", "16384")
            .create()
            .expect("consumer");
        consumer.subscribe(&[input]).expect("subscribe");
        let producer: BaseProducer = client
            .set("transactional.id", format!("{group}-copy"))
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("queue.buffering.max.kbytes", "65536")
            .create()
            .expect("producer");
        producer
            .init_transactions(Duration::from_secs(30))
            .expect("init_transactions");

        // Stop when the driver closes our stdin.
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            stop_flag.store(true, Ordering::Relaxed);
        });

        let mut announced = false;
        let mut commits = CommitStats::default();
        let mut positions: Vec<Option<i64>> = vec![None; PARTITIONS as usize];
        let mut txn_started: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            let polled = consumer.poll(Duration::from_millis(50));
            if !announced && consumer.assignment().is_ok_and(|a| a.count() > 0) {
                std::fs::write(ready, b"").expect("ready file");
                announced = true;
            }
            match polled {
                Some(Ok(m)) => {
                    if txn_started.is_none() {
                        producer.begin_transaction().expect("begin_transaction");
                        txn_started = Some(Instant::now());
                    }
                    let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
                    if let Some(k) = m.key() {
                        record = record.key(k);
                    }
                    if let Some(v) = m.payload() {
                        record = record.payload(v);
                    }
                    testbed::kafka::send(&producer, record);
                    positions[m.partition() as usize] = Some(m.offset() + 1);
                }
                Some(Err(e)) => eprintln!("consumer error: {e}"),
                None => {}
            }
            producer.poll(Duration::ZERO);
            if txn_started.is_some_and(|t| t.elapsed() >= COMMIT_INTERVAL) {
                commits.time(|| commit(&consumer, &producer, input, &mut positions));
                txn_started = None;
            }
        }
        if txn_started.is_some() {
            commits.time(|| commit(&consumer, &producer, input, &mut positions));
        }
        // Read by the driver (stop_and_report) from this process's log.
        eprintln!(
            "transactions: {} committed, mean commit {:.1} ms",
            commits.count,
            commits.mean_ms()
        );
    }

    /// How long commits (send_offsets_to_transaction + commit_transaction) take.
    #[derive(Default)]
    struct CommitStats {
        count: u64,
        total: Duration,
    }

    impl CommitStats {
        fn time(&mut self, f: impl FnOnce()) {
            let start = Instant::now();
            f();
            self.count += 1;
            self.total += start.elapsed();
        }

        fn mean_ms(&self) -> f64 {
            self.total.as_secs_f64() * 1000.0 / self.count.max(1) as f64
        }
    }

    /// Commits the open transaction with the consumed positions (exactly-once: output and
    /// offsets together).
    fn commit(
        consumer: &BaseConsumer,
        producer: &BaseProducer,
        input: &str,
        positions: &mut [Option<i64>],
    ) {
        let mut tpl = TopicPartitionList::new();
        for (p, pos) in positions.iter_mut().enumerate() {
            if let Some(o) = pos.take() {
                tpl.add_partition_offset(input, p as i32, Offset::Offset(o))
                    .unwrap();
            }
        }
        let group = consumer.group_metadata().expect("group metadata");
        producer
            .send_offsets_to_transaction(&tpl, &group, Duration::from_secs(10))
            .expect("send_offsets_to_transaction");
        producer
            .commit_transaction(Duration::from_secs(10))
            .expect("commit_transaction");
    }
}

/// Extra librdkafka properties for both systems' clients (`BENCH_SYSTEM_PROPS="k=v,k=v"`), to
/// see how a client setting moves the figures; none by default.
fn system_properties() -> std::collections::BTreeMap<String, String> {
    std::env::var("BENCH_SYSTEM_PROPS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

// ---- small helpers -------------------------------------------------------------------------

/// Creates topics (4 partitions) and remembers them for deletion at the end.
struct Topics<'a> {
    runtime: &'a tokio::runtime::Runtime,
    created: Vec<String>,
}

impl Topics<'_> {
    fn create(&mut self, names: &[&str]) {
        for name in names {
            self.runtime.block_on(kafka::create_topic(name, PARTITIONS));
            self.created.push((*name).to_string());
        }
    }

    fn delete_all(&self) {
        if self.created.is_empty() {
            return;
        }
        let admin: AdminClient<DefaultClientContext> =
            kafka::client_config().create().expect("admin client");
        let names: Vec<&str> = self.created.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        if let Err(e) = self.runtime.block_on(admin.delete_topics(&names, &opts)) {
            eprintln!("deleting the benchmark's topics: {e}");
        }
    }
}

/// An HTTP call to a processor on 127.0.0.1: (status, body).
fn http(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    streamapp_api::probe::call(addr, method, path, Duration::from_secs(60))
        .ok()
        .map(|r| (r.status, r.body))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// utime + stime of a process (all its threads), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
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
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
