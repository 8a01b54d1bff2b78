//! What a run measures and how, from the environment (`BENCH_*`, listed in `main.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use crate::scaling;
use crate::systems::Peer;

/// The phases of a run, in order (`BENCH_PHASES` picks some).
pub(crate) const PHASES: [&str; 5] = ["throughput", "latency", "recovery", "failover", "scaling"];

pub struct Settings {
    pub(crate) records: u64,
    pub(crate) runs: usize,
    pub(crate) keying: Keying,
    pub(crate) retention: Duration,
    /// Processing threads of each system (`BENCH_THREADS`).
    pub(crate) threads: u32,
    pub(crate) latency_percent: u64,
    pub(crate) latency_rate: Option<u64>,
    pub(crate) latency_warmup: Duration,
    pub(crate) latency_duration: Duration,
    pub(crate) recovery_keys: Vec<u64>,
    pub(crate) failover_keys: Vec<u64>,
    /// Scaling: how many processes and threads in turn (`BENCH_SCALING_PROCESSES` of one
    /// thread, one process of each of `BENCH_SCALING_THREADS`), on how many records.
    pub(crate) scaling_shapes: Vec<scaling::Shape>,
    pub(crate) scaling_records: u64,
    /// The producers' `linger.ms` values the throughput phase sweeps (`BENCH_LINGERS`); each
    /// system is reported at its best, and measured for latency at it.
    pub(crate) lingers: Vec<u32>,
    /// The phases to run (`BENCH_PHASES`), all by default.
    pub(crate) phases: Vec<String>,
    /// The systems to run (`BENCH_PEERS`, by name), all by default.
    pub(crate) peers: Vec<Peer>,
    pub ks_cache_bytes: u64,
    pub java: String,
    pub java_opts: Vec<String>,
    pub ks_classpath: String,
    pub(crate) csv: PathBuf,
    /// The CSV of an earlier run whose throughput phase sets this run's latency loads and
    /// lingers when this run does not measure throughput (`BENCH_THROUGHPUT_FROM`).
    pub(crate) throughput_from: Option<PathBuf>,
}

/// A comma-separated list of key counts from the environment variable `name`.
fn key_counts(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.into())
        .split(',')
        .filter(|n| !n.trim().is_empty())
        .map(|n| {
            n.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {n} is not a number"))
        })
        .collect()
}

impl Settings {
    pub(crate) fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let records = env_num("BENCH_RECORDS", 5_000_000);
        Settings {
            records,
            runs: env_num("BENCH_RUNS", 3).max(1) as usize,
            keying: match var("BENCH_KEYING").as_deref() {
                None | Some("unrelated") => Keying::Unrelated,
                Some("id") => Keying::Id,
                Some(other) => panic!("BENCH_KEYING={other}: unrelated or id"),
            },
            retention: Duration::from_secs(env_num("BENCH_RETENTION_SECONDS", 120)),
            threads: env_num("BENCH_THREADS", 1) as u32,
            latency_percent: env_num("BENCH_LATENCY_PERCENT", 50),
            latency_rate: var("BENCH_LATENCY_RATE").map(|_| env_num("BENCH_LATENCY_RATE", 0)),
            latency_warmup: Duration::from_secs(env_num("BENCH_LATENCY_WARMUP_SECONDS", 30)),
            latency_duration: Duration::from_secs(env_num("BENCH_LATENCY_SECONDS", 20)),
            recovery_keys: key_counts("BENCH_RECOVERY_KEYS", "20000,1000000,5000000"),
            failover_keys: key_counts("BENCH_FAILOVER_KEYS", "1000000"),
            scaling_shapes: scaling::shapes(
                &key_counts("BENCH_SCALING_PROCESSES", "1,2,4"),
                &key_counts("BENCH_SCALING_THREADS", "2"),
            ),
            scaling_records: env_num("BENCH_SCALING_RECORDS", records / 2),
            lingers: key_counts("BENCH_LINGERS", "5,20,50")
                .into_iter()
                .map(|l| l as u32)
                .collect(),
            phases: var("BENCH_PHASES")
                .unwrap_or_else(|| PHASES.join(","))
                .split(',')
                .map(|p| p.trim().to_string())
                .inspect(|p| {
                    assert!(
                        PHASES.contains(&p.as_str()),
                        "BENCH_PHASES: {p} is not one of {PHASES:?}"
                    )
                })
                .collect(),
            peers: var("BENCH_PEERS").map_or(Peer::ALL.to_vec(), |names| {
                names
                    .split(',')
                    .map(|n| {
                        Peer::ALL
                            .into_iter()
                            .find(|p| p.name() == n.trim())
                            .unwrap_or_else(|| panic!("BENCH_PEERS: no system named {n}"))
                    })
                    .collect()
            }),
            ks_cache_bytes: env_num("BENCH_KS_CACHE_BYTES", 0),
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
            throughput_from: var("BENCH_THROUGHPUT_FROM").map(PathBuf::from),
        }
    }

    pub(crate) fn repartitions(&self) -> bool {
        self.keying == Keying::Unrelated
    }

    /// One application's options: one instance, no standbys, the clients' group timing.
    pub(crate) fn options(&self, retention: Duration) -> AppOptions {
        AppOptions {
            repartition: self.repartitions(),
            retention,
            standby_replicas: 0,
            session_timeout: None,
            partitions: PARTITIONS,
            processing_threads: self.threads,
            linger_ms: LINGER_MS,
            wal: Wal::Default,
        }
    }

    pub(crate) fn runs(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p == phase)
    }

    /// Of `peers`, those `BENCH_PEERS` selects.
    pub(crate) fn selected<const N: usize>(&self, peers: [Peer; N]) -> Vec<Peer> {
        peers
            .into_iter()
            .filter(|p| self.peers.contains(p))
            .collect()
    }

    /// Run `r`'s order: forwards, backwards, forwards...
    pub(crate) fn order<const N: usize>(&self, peers: [Peer; N], r: usize) -> Vec<Peer> {
        let mut order = self.selected(peers);
        if r % 2 == 1 {
            order.reverse();
        }
        order
    }
}
