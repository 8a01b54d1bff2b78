//! Benchmark: streamapp-processor next to Kafka Streams 4.4 running the same dedup topology
//! (bench/kafka-streams: the id read from the JSON value, a persistent RocksDB window store with
//! the same retention, output and duplicates topics, exactly_once_v2, commit interval 100 ms),
//! one after the other in the same run, on the same local broker, with the same input.
//!
//! Run it with `make bench-compare`, which installs what it needs (Kafka, the Java peer through
//! Maven, matplotlib for the chart), starts the broker if it is not running, runs this, and
//! draws the chart. This program needs `BENCH_KS_CLASSPATH` (the peer's classpath).
//!
//! The systems:
//! - `streamapp`: the real `streamapp-processor` binary with the default RocksDB profile;
//! - `kafka-streams-eos`: Kafka Streams, `processing.guarantee=exactly_once_v2`;
//! - `kafka-streams-txn`: the same with `enable.transactional.statestores=true` (KIP-892,
//!   new in Kafka Streams 4.4: store writes are buffered until the changelog transaction
//!   commits, so a crash no longer wipes the store).
//!
//! All three use static group membership (`group.instance.id`, as a StatefulSet pod does), one
//! processing thread, and their libraries' defaults otherwise; the JVM gets `-Xmx1g`
//! (`BENCH_JAVA_OPTS`).
//!
//! What one run does:
//! 1. Input: `BENCH_RECORDS` (default 1,000,000) JSON records of 200 B, 4 partitions, 30% repeats.
//! 2. Throughput, CPU seconds per million records and peak RSS: each system consumes all of it
//!    in a process of its own, from ready (assigned, restored) to the commit of the last record.
//! 3. Correctness, before any figure is believed: each system's committed output holds every
//!    input id exactly once and nothing else, and the duplicates topic every repeat — so the
//!    three outputs hold the same set of ids. A wrong output fails the run here.
//! 4. Latency p50/p99 at a fixed load of half the slower system's throughput
//!    (`BENCH_LATENCY_RATE` overrides it), `BENCH_LATENCY_SECONDS` (20) after a 3 s warm-up,
//!    each system on fresh topics.
//! 5. Recovery after kill -9, for each key count in `BENCH_RECOVERY_KEYS` (default
//!    1000000,5000000): each system loads that many distinct ids into its store; live traffic
//!    (1,000 records/s of new ids) runs for 3 s so that the kill lands mid-transaction; kill -9;
//!    1,000 new records are sent; the system is restarted on the same state directory. Measured:
//!    time from the restart to the first new committed output record, to catching up with the
//!    input, and the records it restored from its changelog. Then its output is checked again:
//!    every id exactly once across the crash.
//! 6. A table with the ratios, and a CSV (`BENCH_CSV`, default bench/results/vs-kafka-streams.csv)
//!    from which bench/compare/chart.py draws the PNG.

mod common;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use common::*;
use rdkafka::producer::{BaseProducer, Producer};
use testbed::kafka;

/// New records sent while a system is down after its crash.
const PROBES: u64 = 1_000;
/// Live traffic before the kill.
const LIVE_RATE: u64 = 1_000;
const LIVE_FOR: Duration = Duration::from_secs(3);

fn main() -> ExitCode {
    let settings = Settings::from_env();
    run(|runtime, topics| bench(&settings, runtime, topics))
}

struct Settings {
    records: u64,
    latency_rate: Option<u64>,
    latency_duration: Duration,
    recovery_keys: Vec<u64>,
    java: String,
    java_opts: Vec<String>,
    ks_classpath: String,
    csv: PathBuf,
}

impl Settings {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        Settings {
            records: env_num("BENCH_RECORDS", 1_000_000),
            latency_rate: var("BENCH_LATENCY_RATE").map(|_| env_num("BENCH_LATENCY_RATE", 0)),
            latency_duration: Duration::from_secs(env_num("BENCH_LATENCY_SECONDS", 20)),
            recovery_keys: var("BENCH_RECOVERY_KEYS")
                .unwrap_or_else(|| "1000000,5000000".into())
                .split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("BENCH_RECOVERY_KEYS: {n} is not a number"))
                })
                .collect(),
            java: var("BENCH_JAVA").unwrap_or_else(|| "java".into()),
            java_opts: var("BENCH_JAVA_OPTS")
                .unwrap_or_else(|| "-Xmx1g".into())
                .split_whitespace()
                .map(String::from)
                .collect(),
            ks_classpath: var("BENCH_KS_CLASSPATH").unwrap_or_else(|| {
                panic!(
                    "BENCH_KS_CLASSPATH is not set: the Kafka Streams peer is built and this \
                     benchmark run by `make bench-compare`"
                )
            }),
            csv: var("BENCH_CSV").map_or_else(
                || repo.join("bench/results/vs-kafka-streams.csv"),
                PathBuf::from,
            ),
        }
    }
}

/// The systems compared, in the order they run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    Streamapp,
    KafkaStreamsEos,
    KafkaStreamsTxn,
}

impl Peer {
    const ALL: [Peer; 3] = [
        Peer::Streamapp,
        Peer::KafkaStreamsEos,
        Peer::KafkaStreamsTxn,
    ];

    fn name(self) -> &'static str {
        match self {
            Peer::Streamapp => "streamapp",
            Peer::KafkaStreamsEos => "kafka-streams-eos",
            Peer::KafkaStreamsTxn => "kafka-streams-txn",
        }
    }
}

/// One application of one system: its topics and state directory.
struct App {
    peer: Peer,
    id: String,
    input: String,
    output: String,
    duplicates: String,
    dir: PathBuf,
    /// The processor's own configuration (streamapp only).
    processor: Option<DedupApp>,
}

impl App {
    fn create(topics: &mut Topics<'_>, work: &Path, peer: Peer, id: &str, input: &str) -> App {
        if peer == Peer::Streamapp {
            let app = DedupApp::create(topics, work, id, input);
            return App {
                peer,
                id: id.into(),
                input: input.into(),
                output: app.output.clone(),
                duplicates: app.duplicates.clone(),
                dir: app.dir.clone(),
                processor: Some(app),
            };
        }
        let (output, duplicates) = (format!("{id}-out"), format!("{id}-dups"));
        topics.create(&[&output, &duplicates]);
        // Kafka Streams creates its changelog; listed so that it is deleted with the rest.
        topics.created.push(format!("{id}-dedup-store-changelog"));
        let dir = work.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        App {
            peer,
            id: id.into(),
            input: input.into(),
            output,
            duplicates,
            dir,
            processor: None,
        }
    }

    /// Starts (or restarts, on the same state directory) the system's process.
    fn start(&self, settings: &Settings) -> System {
        if let Some(processor) = &self.processor {
            return processor.start();
        }
        let mut command = Command::new(&settings.java);
        command
            .args(&settings.java_opts)
            .arg("-cp")
            .arg(&settings.ks_classpath)
            .arg("dev.streamapp.bench.DedupApp")
            .arg(format!("bootstrap={}", kafka::bootstrap()))
            .arg(format!("application-id={}", self.id))
            .arg(format!("input={}", self.input))
            .arg(format!("output={}", self.output))
            .arg(format!("duplicates={}", self.duplicates))
            .arg(format!("state-dir={}", self.dir.join("state").display()))
            .arg(format!("retention-ms={}", RETENTION.as_millis()))
            .arg(format!(
                "transactional-stores={}",
                self.peer == Peer::KafkaStreamsTxn
            ))
            .arg("group-instance-id=bench-0")
            .arg(format!("ready-file={}", self.dir.join("ready").display()));
        System::start_peer(
            self.peer.name(),
            command,
            &self.id,
            &self.input,
            self.dir.join("ready"),
            self.dir.join("app.log"),
        )
    }

    /// Changelog records the latest start restored: the processor's metric, or the sum of the
    /// Kafka Streams peer's "restored" lines since its last start.
    fn restored(&self, system: &System) -> u64 {
        if self.processor.is_some() {
            return system.processor_metrics()("restore_records_total") as u64;
        }
        let log = std::fs::read_to_string(&system.log).unwrap_or_default();
        let since_start = log
            .rsplit_once(" state CREATED -> ")
            .map_or(log.as_str(), |(_, after)| after);
        since_start
            .lines()
            .filter_map(|l| {
                let rest = l.split_once(" restored ")?.1;
                rest.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .sum()
    }
}

/// What a recovery after kill -9 cost one system.
#[derive(Clone, Copy, Default)]
struct Recovery {
    first_output_s: f64,
    caught_up_s: f64,
    restored: u64,
}

/// The whole run. Returns whether every output was correct.
fn bench(settings: &Settings, runtime: &tokio::runtime::Runtime, topics: &mut Topics<'_>) -> bool {
    println!(
        "streamapp-processor vs Kafka Streams 4.4: {} records, {PARTITIONS} partitions, commit interval {COMMIT_INTERVAL:?}, broker {}",
        settings.records,
        kafka::bootstrap()
    );
    println!(
        "machine: {} cores; load average at start: {}; JVM options: {}",
        cores(),
        loadavg(),
        settings.java_opts.join(" ")
    );
    // Kept when the run fails (logs and state directories to look at) or BENCH_KEEP_WORK is
    // set; removed when it passes.
    let mut work = tempfile::Builder::new()
        .prefix("streamapp-bench-compare-")
        .tempdir()
        .expect("temp dir");
    work.disable_cleanup(true);
    println!("work dir (logs, state): {}", work.path().display());
    let run = testbed::unique_name("cmp");

    // ---- the input, produced once for all systems ----------------------------------------
    let input = format!("{run}-in");
    topics.create(&[&input]);
    let started = Instant::now();
    let dataset = produce_dataset(&input, settings.records, Workload::new());
    describe_dataset(&dataset, started.elapsed().as_secs_f64());

    // ---- throughput, CPU, memory ----------------------------------------------------------
    let mut figures = Vec::new();
    let mut apps = Vec::new();
    for peer in Peer::ALL {
        let app = App::create(
            topics,
            work.path(),
            peer,
            &format!("{run}-{}", peer.name()),
            &input,
        );
        let mut system = app.start(settings);
        figures.push(measure_throughput(&mut system, settings.records));
        if peer == Peer::Streamapp {
            print_processor_metrics(&system);
        }
        system.stop();
        apps.push(app);
    }

    // ---- correctness first ------------------------------------------------------------------
    let mut correct = true;
    for app in &apps {
        correct &= check_dedup_output(app.peer.name(), &app.output, &app.duplicates, &dataset);
    }
    if !correct {
        println!("AN OUTPUT WAS NOT CORRECT: no figure of this run means anything; stopping here");
        return false;
    }
    println!(
        "all three outputs hold the same {} ids, each exactly once",
        dataset.distinct
    );
    topics.delete_all();

    // ---- latency at a fixed load ------------------------------------------------------------
    let slowest = figures
        .iter()
        .map(|f| f.records_per_s)
        .fold(f64::INFINITY, f64::min);
    let rate = settings
        .latency_rate
        .unwrap_or(((slowest / 2.0 / 100.0).round() as u64 * 100).max(100));
    println!(
        "latency: {rate} records/s (half the slowest throughput, {slowest:.0}/s) for {:?} after a {LATENCY_WARMUP:?} warm-up, each system on fresh topics",
        settings.latency_duration
    );
    for (peer, fig) in Peer::ALL.into_iter().zip(figures.iter_mut()) {
        let id = format!("{run}-lat-{}", peer.name());
        let input = format!("{id}-in");
        topics.create(&[&input]);
        let app = App::create(topics, work.path(), peer, &id, &input);
        let mut system = app.start(settings);
        system.wait_ready();
        measure_latency(
            fig,
            &system,
            &app.output,
            rate,
            settings.latency_duration,
            true,
        );
        system.stop();
    }
    topics.delete_all();

    // ---- recovery after kill -9 --------------------------------------------------------------
    let mut recoveries: Vec<(u64, Vec<Recovery>)> = Vec::new();
    for &keys in &settings.recovery_keys {
        println!("recovery after kill -9 with {keys} keys in the store:");
        let mut row = Vec::new();
        for peer in Peer::ALL {
            // An input of its own per system (the same records each time): the live traffic and
            // the records sent during one system's crash must not reach the next system.
            let id = format!("{run}-rec{keys}-{}", peer.name());
            let input = format!("{id}-in");
            let mut app_topics = Topics {
                runtime,
                created: Vec::new(),
            };
            app_topics.create(&[&input]);
            let loaded = produce_dataset(&input, keys, Workload::with(0.0, "key"));
            let app = App::create(&mut app_topics, work.path(), peer, &id, &input);
            let (recovery, ok) = recover(settings, &app, &loaded);
            correct &= ok;
            row.push(recovery);
            app_topics.delete_all();
            // The state directory of a 5M-key store is large; the next system gets the disk.
            if std::env::var_os("BENCH_KEEP_WORK").is_none() {
                let _ = std::fs::remove_dir_all(&app.dir);
            }
        }
        recoveries.push((keys, row));
    }

    let table = Table::new(&figures, &recoveries);
    table.print();
    table.write_csv(&settings.csv);
    println!("CSV: {}", settings.csv.display());
    println!("load average at end: {}", loadavg());
    if correct && std::env::var_os("BENCH_KEEP_WORK").is_none() {
        let _ = std::fs::remove_dir_all(work.path());
    } else {
        println!("AN OUTPUT WAS NOT CORRECT AFTER A CRASH: see above");
    }
    correct
}

/// Loads `loaded` into a fresh `app`, crashes it under live traffic, restarts it and measures
/// how long it takes to produce again. Returns the figures and whether its output is exactly
/// once across the crash.
fn recover(settings: &Settings, app: &App, loaded: &Dataset) -> (Recovery, bool) {
    let name = app.peer.name();
    let mut system = app.start(settings);
    let watcher = system.offsets_watcher();
    system.wait_ready();
    let started = Instant::now();
    system.wait_committed(&watcher, loaded.records);
    println!(
        "  {name}: {} keys loaded in {:.1} s",
        loaded.records,
        started.elapsed().as_secs_f64()
    );

    // Live traffic, so that the kill lands mid-transaction with uncommitted store writes.
    let producer: BaseProducer = kafka::client_config()
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    let mut ids: HashSet<Vec<u8>> = loaded.ids.clone();
    let mut live = Workload::with(0.0, "live");
    let sent = send_paced(
        &producer,
        &app.input,
        &mut live,
        LIVE_RATE,
        LIVE_FOR,
        |key| {
            ids.insert(key.into_bytes());
        },
    );
    system.kill9();
    producer.flush(Duration::from_secs(30)).expect("flush");

    // While it is down, new records arrive; output from here on is new output.
    let mut after = Workload::with(0.0, "after");
    for _ in 0..PROBES {
        let (key, value) = after.next(now_us());
        send(&producer, &app.input, &key, &value);
        ids.insert(key.into_bytes());
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    let total = loaded.records + sent + PROBES;
    let receiver = Receiver::start(&app.output, Some(&end_offsets(&app.output)));

    let restarted = Instant::now();
    let mut system = app.start(settings);
    // Restoring a large store from scratch takes a while: 1 s more per 20,000 keys.
    let limit = STALL_TIMEOUT + Duration::from_secs(loaded.records / 20_000);
    while receiver.received() == 0 {
        system.check_alive();
        assert!(
            restarted.elapsed() < limit,
            "{name}: no output {:?} after the restart:\n{}",
            restarted.elapsed(),
            log_tail(&system.log)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let first_output_s = restarted.elapsed().as_secs_f64();
    system.wait_committed(&watcher, total);
    let recovery = Recovery {
        first_output_s,
        caught_up_s: restarted.elapsed().as_secs_f64(),
        restored: app.restored(&system),
    };
    receiver.stop();
    system.stop();
    println!(
        "  {name}: after kill -9 ({sent} live records in flight): first new committed output {:.2} s after the restart, caught up after {:.2} s, {} changelog records restored",
        recovery.first_output_s, recovery.caught_up_s, recovery.restored
    );
    let expected = Dataset {
        records: total,
        distinct: total,
        value_bytes: 0,
        ids,
    };
    let ok = check_dedup_output(
        &format!("  {name} (across the crash)"),
        &app.output,
        &app.duplicates,
        &expected,
    );
    (recovery, ok)
}

// ---- the table and the CSV -----------------------------------------------------------------

/// One row: a metric, its unit, whether higher is better, and one value per system.
struct Row {
    metric: String,
    unit: &'static str,
    higher_is_better: bool,
    values: [f64; 3],
}

struct Table {
    rows: Vec<Row>,
}

impl Table {
    fn new(figures: &[Figures], recoveries: &[(u64, Vec<Recovery>)]) -> Table {
        let each = |f: &dyn Fn(&Figures) -> f64| [f(&figures[0]), f(&figures[1]), f(&figures[2])];
        let mut rows = vec![
            Row {
                metric: "throughput".into(),
                unit: "records/s",
                higher_is_better: true,
                values: each(&|f| f.records_per_s),
            },
            Row {
                metric: "CPU per 1M records".into(),
                unit: "CPU s",
                higher_is_better: false,
                values: each(&|f| f.cpu_s_per_million),
            },
            Row {
                metric: "throughput per core".into(),
                unit: "records/CPU s",
                higher_is_better: true,
                values: each(&|f| 1e6 / f.cpu_s_per_million),
            },
            Row {
                metric: "latency p50".into(),
                unit: "ms",
                higher_is_better: false,
                values: each(&|f| f.p50_ms),
            },
            Row {
                metric: "latency p99".into(),
                unit: "ms",
                higher_is_better: false,
                values: each(&|f| f.p99_ms),
            },
            Row {
                metric: "peak RSS".into(),
                unit: "MiB",
                higher_is_better: false,
                values: each(&|f| f.peak_rss_mib),
            },
        ];
        for (keys, r) in recoveries {
            let keys = format_keys(*keys);
            let each = |f: &dyn Fn(&Recovery) -> f64| [f(&r[0]), f(&r[1]), f(&r[2])];
            rows.push(Row {
                metric: format!("recovery {keys} keys: first output"),
                unit: "s",
                higher_is_better: false,
                values: each(&|r| r.first_output_s),
            });
            rows.push(Row {
                metric: format!("recovery {keys} keys: caught up"),
                unit: "s",
                higher_is_better: false,
                values: each(&|r| r.caught_up_s),
            });
            rows.push(Row {
                metric: format!("recovery {keys} keys: records restored"),
                unit: "records",
                higher_is_better: false,
                values: each(&|r| r.restored as f64),
            });
        }
        Table { rows }
    }

    /// How many times better streamapp is than system `i` on `row` (> 1: better).
    fn advantage(row: &Row, i: usize) -> f64 {
        let (ours, theirs) = (row.values[0], row.values[i]);
        if row.higher_is_better {
            ours / theirs
        } else {
            theirs / ours
        }
    }

    fn print(&self) {
        println!();
        println!(
            "{:<38} {:>13} {:>13} {:>13} {:>13} {:>11} {:>11}",
            "metric", "unit", "streamapp", "KS EOS", "KS txn", "vs KS EOS", "vs KS txn"
        );
        for row in &self.rows {
            let v = |x: f64| {
                if x >= 100.0 {
                    format!("{x:.0}")
                } else {
                    format!("{x:.2}")
                }
            };
            let ratio = |i| {
                let a = Self::advantage(row, i);
                if a.is_finite() {
                    format!("{a:.1}x")
                } else {
                    "-".into()
                }
            };
            println!(
                "{:<38} {:>13} {:>13} {:>13} {:>13} {:>11} {:>11}",
                row.metric,
                row.unit,
                v(row.values[0]),
                v(row.values[1]),
                v(row.values[2]),
                ratio(1),
                ratio(2)
            );
        }
        println!(
            "(vs: how many times better streamapp is — higher throughput, or lower CPU, latency, memory, time)"
        );
        let find = |m: &str| self.rows.iter().find(|r| r.metric == m);
        if let Some(row) = find("throughput per core") {
            let a = Self::advantage(row, 1);
            println!(
                "goal: at least 2x Kafka Streams' throughput per core: {a:.1}x vs EOS, {:.1}x vs transactional stores — {}",
                Self::advantage(row, 2),
                if a >= 2.0 { "met" } else { "NOT met" }
            );
        }
        for row in self
            .rows
            .iter()
            .filter(|r| r.metric.ends_with("first output"))
        {
            let a = Self::advantage(row, 1);
            println!(
                "goal: recovery at least 10x faster than Kafka Streams' wipe-and-restore ({}): {a:.1}x — {}",
                row.metric,
                if a >= 10.0 { "met" } else { "NOT met" }
            );
        }
        println!();
    }

    fn write_csv(&self, path: &Path) {
        let mut csv = String::from(
            "metric,unit,higher_is_better,streamapp,kafka_streams_eos,kafka_streams_txn\n",
        );
        for row in &self.rows {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{}",
                row.metric,
                row.unit,
                row.higher_is_better,
                row.values[0],
                row.values[1],
                row.values[2]
            );
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("CSV folder");
        }
        std::fs::write(path, csv).expect("writing the CSV");
    }
}

fn format_keys(keys: u64) -> String {
    if keys.is_multiple_of(1_000_000) {
        format!("{}M", keys / 1_000_000)
    } else if keys.is_multiple_of(1_000) {
        format!("{}k", keys / 1_000)
    } else {
        keys.to_string()
    }
}
