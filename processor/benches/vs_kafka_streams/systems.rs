//! The systems compared, and one application of one of them: its topics, its state directory,
//! how it is started and how its output is checked.

use std::path::{Path, PathBuf};

use rdkafka::consumer::BaseConsumer;
use testbed::kafka::{self, Isolation};

use crate::Settings;
use crate::common::*;

/// The Kafka Streams producer's batch size in the tuned configurations: librdkafka's default,
/// which the processor uses (their `linger.ms` is the run's, as every other system's).
const KS_TUNED_BATCH_BYTES: u32 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The real `streamapp-processor` binary, default RocksDB profile.
    Streamapp,
    /// `Streamapp` with an fsync of RocksDB's WAL per applied commit.
    StreamappWalSync,
    /// `Streamapp` without RocksDB's WAL, as Kafka Streams runs RocksDB.
    StreamappNoWal,
    /// The floor of the topology: its Kafka work alone, no store.
    Skeleton,
    /// A plain transactional copy, no dedup, no store (a reference row).
    Copy,
    /// Kafka Streams as the topology is written, every setting at the library's default (the
    /// producer lingers 100 ms under EOS, the store is not cached), a window store.
    KsDefaults,
    /// Kafka Streams tuned: window store, producer linger and batch size matched.
    KsWindow,
    /// Kafka Streams tuned: key-value store with point lookups, expiry by punctuation.
    KsKeyValue,
    /// `KsWindow` with KIP-892 transactional state stores (a crash no longer wipes the
    /// store): measured in the recovery phase, where that is what differs.
    KsWindowTxn,
}

impl Peer {
    /// Throughput: every system, the processor with each WAL setting, the skeleton and the
    /// copy as references.
    pub const MEASURED: [Peer; 8] = [
        Peer::Streamapp,
        Peer::StreamappWalSync,
        Peer::StreamappNoWal,
        Peer::Skeleton,
        Peer::Copy,
        Peer::KsDefaults,
        Peer::KsWindow,
        Peer::KsKeyValue,
    ];
    /// Latency: the dedup systems.
    pub const LATENCY: [Peer; 4] = [
        Peer::Streamapp,
        Peer::KsDefaults,
        Peer::KsWindow,
        Peer::KsKeyValue,
    ];
    /// Recovery after kill -9: wipe-and-restore next to transactional stores.
    pub const RECOVERED: [Peer; 3] = [Peer::Streamapp, Peer::KsWindow, Peer::KsWindowTxn];
    /// A full restore into an empty state directory: the processor and the peer's best
    /// configuration with the same store (the window store; KIP-892 changes nothing there).
    pub const RESTORED: [Peer; 2] = [Peer::Streamapp, Peer::KsWindow];
    /// Failover to a standby (and without one): two instances each.
    pub const FAILED_OVER: [Peer; 2] = [Peer::Streamapp, Peer::KsWindow];
    /// Every column of the table and the CSV.
    pub const ALL: [Peer; 9] = [
        Peer::Streamapp,
        Peer::StreamappWalSync,
        Peer::StreamappNoWal,
        Peer::Skeleton,
        Peer::Copy,
        Peer::KsDefaults,
        Peer::KsWindow,
        Peer::KsKeyValue,
        Peer::KsWindowTxn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Peer::Streamapp => "streamapp",
            Peer::StreamappWalSync => "streamapp-walsync",
            Peer::StreamappNoWal => "streamapp-nowal",
            Peer::Skeleton => "skeleton",
            Peer::Copy => "copy",
            Peer::KsDefaults => "ks-defaults",
            Peer::KsWindow => "ks-window",
            Peer::KsKeyValue => "ks-kv",
            Peer::KsWindowTxn => "ks-window-txn",
        }
    }

    /// The CSV column.
    pub fn column(self) -> String {
        self.name().replace('-', "_")
    }

    pub fn is_kafka_streams(self) -> bool {
        matches!(
            self,
            Peer::KsDefaults | Peer::KsWindow | Peer::KsKeyValue | Peer::KsWindowTxn
        )
    }

    /// The real processor, with one WAL setting or another.
    pub fn is_streamapp(self) -> bool {
        matches!(
            self,
            Peer::Streamapp | Peer::StreamappWalSync | Peer::StreamappNoWal
        )
    }

    /// The processor's WAL in this configuration.
    fn wal(self) -> Wal {
        match self {
            Peer::StreamappWalSync => Wal::SyncOnCommit,
            Peer::StreamappNoWal => Wal::Off,
            _ => Wal::Default,
        }
    }

    /// Whether the producer's `linger.ms` is the run's: not for Kafka Streams at its defaults
    /// (it lingers 100 ms under EOS; that is what the column is about).
    pub fn takes_linger(self) -> bool {
        self != Peer::KsDefaults
    }

    /// Whether the throughput phase measures it at every `linger.ms` of the sweep: the systems
    /// the goals compare (this processor, the skeleton, the tuned Kafka Streams). The WAL
    /// variants and the copy, reference rows, are measured at the sweep's first value only
    /// (where the sweep's table shows the processor too), and `ks-defaults` at its own: each
    /// of them once a run, which keeps a full run's throughput phase near two hours.
    pub fn swept(self) -> bool {
        matches!(
            self,
            Peer::Streamapp | Peer::Skeleton | Peer::KsWindow | Peer::KsKeyValue
        )
    }

    pub fn describe(self) -> &'static str {
        match self {
            Peer::Streamapp => {
                "streamapp-processor, default RocksDB profile (a WAL, not synced per commit)"
            }
            Peer::StreamappWalSync => {
                "streamapp-processor, an fsync of RocksDB's WAL per applied commit (rocksdb.wal.syncOnCommit)"
            }
            Peer::StreamappNoWal => {
                "streamapp-processor without RocksDB's WAL (rocksdb.wal.enabled: false), as Kafka Streams runs RocksDB"
            }
            Peer::Skeleton => {
                "the topology's Kafka work alone, a set of id hashes for the store (the floor)"
            }
            Peer::Copy => "plain transactional copy, no store",
            Peer::KsDefaults => "Kafka Streams, library defaults, window store",
            Peer::KsWindow => "Kafka Streams tuned, window store (range fetch)",
            Peer::KsKeyValue => "Kafka Streams tuned, key-value store (point lookup)",
            Peer::KsWindowTxn => "Kafka Streams tuned, window store, transactional stores",
        }
    }

    /// The peer's command-line settings for this configuration, its producer lingering
    /// `linger_ms` when tuned.
    fn kafka_streams_args(self, settings: &Settings, linger_ms: u32) -> Vec<String> {
        let tuned = [
            format!("linger-ms={linger_ms}"),
            format!("batch-size={KS_TUNED_BATCH_BYTES}"),
            format!("cache-bytes={}", settings.ks_cache_bytes),
        ];
        let (store, tuned, txn) = match self {
            Peer::KsDefaults => ("window", &[][..], false),
            Peer::KsWindow => ("window", &tuned[..], false),
            Peer::KsKeyValue => ("kv", &tuned[..], false),
            Peer::KsWindowTxn => ("window", &tuned[..], true),
            _ => unreachable!("not Kafka Streams"),
        };
        let mut args = vec![
            format!("store={store}"),
            format!("transactional-stores={txn}"),
        ];
        args.extend(tuned.iter().cloned());
        args
    }
}

/// One application of one system: its topics and state directory.
pub struct App {
    pub peer: Peer,
    pub id: String,
    pub input: String,
    pub output: String,
    pub duplicates: String,
    pub repartition: Option<String>,
    pub retention: std::time::Duration,
    /// The input's partitions (and the internal topics').
    partitions: i32,
    /// The producer's `linger.ms` (see [`Peer::takes_linger`]).
    linger_ms: u32,
    /// `num.standby.replicas` of a Kafka Streams peer (the processor's is in its configuration).
    standby_replicas: u32,
    /// `num.stream.threads` of a Kafka Streams peer (the processor's `processingThreads` is in
    /// its configuration).
    stream_threads: u32,
    /// The group's timing, as librdkafka and the Java client both name it.
    group_properties: Vec<(String, String)>,
    pub dir: PathBuf,
    /// Every topic of this application (not its input), to delete when it is done.
    pub topics: Vec<String>,
    /// The processor's own configuration (streamapp only).
    processor: Option<DedupApp>,
}

impl App {
    /// Creates the topics of a new application of `peer` reading `input`, configured as
    /// `options` say (`repartition`: the input is not keyed by the id, so the system re-keys it
    /// through a repartition topic).
    pub fn create(
        topics: &mut Topics<'_>,
        work: &Path,
        peer: Peer,
        id: &str,
        input: &str,
        options: &AppOptions,
    ) -> App {
        let before = topics.created.len();
        let dir = work.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let mut app = App {
            peer,
            id: id.into(),
            input: input.into(),
            output: format!("{id}-out"),
            duplicates: format!("{id}-dups"),
            repartition: None,
            retention: options.retention,
            partitions: options.partitions,
            linger_ms: options.linger_ms,
            standby_replicas: options.standby_replicas,
            stream_threads: options.processing_threads,
            group_properties: options.group_properties(),
            dir,
            topics: Vec::new(),
            processor: None,
        };
        match peer {
            _ if peer.is_streamapp() => {
                let options = AppOptions {
                    wal: peer.wal(),
                    ..*options
                };
                let processor = DedupApp::create(topics, work, id, input, &options);
                app.output = processor.output.clone();
                app.duplicates = processor.duplicates.clone();
                app.repartition = processor.repartition.clone();
                app.processor = Some(processor);
            }
            Peer::Skeleton => {
                let changelog = format!("{id}-dedup-changelog");
                let mut names = vec![app.output.clone(), app.duplicates.clone(), changelog];
                if options.repartition {
                    let internal = format!("{id}-dedup-repartition");
                    names.push(internal.clone());
                    app.repartition = Some(internal);
                }
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                topics.create_with(&names, options.partitions);
            }
            Peer::Copy => topics.create_with(&[&app.output], options.partitions),
            _ => {
                topics.create_with(&[&app.output, &app.duplicates], options.partitions);
                // Kafka Streams creates these; listed so that they are deleted with the rest.
                topics.created.push(format!("{id}-dedup-store-changelog"));
                if options.repartition {
                    let internal = format!("{id}-dedup-repartition");
                    topics.created.push(internal.clone());
                    app.repartition = Some(internal);
                }
            }
        }
        app.topics = topics.created[before..].to_vec();
        app
    }

    /// The input's partitions: the stateful tasks of one instance that runs them all.
    pub fn partitions(&self) -> usize {
        self.partitions as usize
    }

    /// Starts (or restarts, on the same state directory) the system's process.
    pub fn start(&self, settings: &Settings) -> System {
        self.start_instance(settings, SINGLE_INSTANCE)
    }

    /// Starts (or restarts, on its own state directory) instance `instance` of the system: the
    /// pod of that name, `group.instance.id` `instance`. The copy runs as one instance only.
    pub fn start_instance(&self, settings: &Settings, instance: &str) -> System {
        if let Some(processor) = &self.processor {
            return processor.start_instance(instance);
        }
        let work = self.dir.parent().expect("work dir");
        match self.peer {
            Peer::Copy => {
                return reference::copy::start_copy(
                    work,
                    &self.id,
                    &self.input,
                    &self.output,
                    self.linger_ms,
                );
            }
            Peer::Skeleton => {
                let changelog = format!("{}-dedup-changelog", self.id);
                let topics = reference::skeleton::SkeletonTopics {
                    repartition: self.repartition.as_deref(),
                    partitions: self.partitions,
                    changelog: &changelog,
                    output: &self.output,
                    duplicates: &self.duplicates,
                };
                return reference::skeleton::start_skeleton(
                    work,
                    &self.id,
                    &self.input,
                    &topics,
                    self.linger_ms,
                );
            }
            _ => {}
        }
        let dir = instance_dir(&self.dir, instance);
        let mut command = system_command(&settings.java);
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
            .arg(format!("state-dir={}", dir.join("state").display()))
            .arg(format!("retention-ms={}", self.retention.as_millis()))
            .arg(format!("repartition={}", self.repartition.is_some()))
            .args(self.peer.kafka_streams_args(settings, self.linger_ms))
            .arg(format!("standby-replicas={}", self.standby_replicas))
            .arg(format!("stream-threads={}", self.stream_threads))
            .args(
                self.group_properties
                    .iter()
                    .map(|(k, v)| format!("consumer.{k}={v}")),
            )
            .arg(format!("group-instance-id={instance}"))
            .arg(format!("ready-file={}", dir.join("ready").display()))
            .arg(format!("tasks-file={}", dir.join("tasks").display()));
        let mut system = System::start_peer(
            &format!("{} {instance}", self.peer.name()),
            command,
            &self.id,
            &self.input,
            dir.join("ready"),
            dir.join("app.log"),
        );
        system.tasks_file = Some(dir.join("tasks"));
        system.repartition = self.repartition.clone();
        system
    }

    /// Exactly once: a dedup system's committed output holds every id of `dataset` once and
    /// nothing else, its duplicates topic every repeat; the copy's output every input record.
    pub fn check(&self, label: &str, dataset: &Dataset) -> OutputCheck {
        if self.peer != Peer::Copy {
            return check_dedup_output(label, &self.output, &self.duplicates, dataset);
        }
        let copied = kafka::read_all(&self.output, Isolation::ReadCommitted, |_| {}) as u64;
        let correct = copied == dataset.records;
        let line = format!(
            "{label} output: {copied} records (input {}) — every record exactly once: {}",
            dataset.records,
            if correct { "yes" } else { "NO" }
        );
        println!("{line}");
        OutputCheck { correct, line }
    }

    /// When `check` found the output wrong, adds what to look into to its line: the group's
    /// committed offsets (through `watcher`) against the topics' ends, the recent warnings of
    /// the instances' `logs`, and the processor's dead letters.
    pub fn explain(&self, check: &mut OutputCheck, watcher: &BaseConsumer, logs: &[PathBuf]) {
        if check.correct {
            return;
        }
        let mut lines = vec![
            check.line.clone(),
            offsets_report(watcher, &self.input, self.repartition.as_deref()),
        ];
        lines.extend(logs.iter().map(|log| log_warnings(log, 20)));
        if self.peer.is_streamapp() {
            let dead_letters = kafka::read_all(
                &format!("{}-dlq", self.id),
                Isolation::ReadCommitted,
                |_| {},
            );
            lines.push(format!("{}: {dead_letters} dead letters", self.peer.name()));
        }
        check.line = lines.join("\n    ");
    }

    /// Changelog records the latest start restored: the processor's metric, or the sum of the
    /// Kafka Streams peer's "restored" lines since its last start.
    pub fn restored(&self, system: &System) -> u64 {
        if self.processor.is_some() {
            return system.processor_metrics()("restore_records_total") as u64;
        }
        crate::restore::PeerRestores::read(&system.own_log())
            .finished
            .records
    }

    /// Deletes the application's topics and, unless BENCH_KEEP_WORK is set, its state
    /// directory (a multi-million-id store is large; the next system gets the disk).
    pub fn remove(&self, topics: &mut Topics<'_>) {
        topics.delete(&self.topics);
        if std::env::var_os("BENCH_KEEP_WORK").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
