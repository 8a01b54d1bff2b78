//! A full restore: a system stopped cleanly after a recovery run, its state directory deleted
//! (a lost disk, a pod on a new node), and started again on the same application. It rebuilds
//! its store from the changelog before it processes anything. Measured:
//!
//! - the restore rate: changelog records restored per second, from each system's own report of
//!   when its restores began and ended (the processor's `/health`: every task's
//!   `restore.startedAtMs` and `finishedAtMs`; the Kafka Streams peer's `restore-start` and
//!   `restored` lines, printed by its `StateRestoreListener`), from the first start to the last
//!   end, over every partition;
//! - back in service: from the process start until every task is restored (what a user waits;
//!   it includes the process start, the group join and, for the peer, the JVM's start);
//! - the work left after that: how long the system stays busy once in service (RocksDB
//!   compacting what the restore wrote, on either side; the processor merges a bulk load's
//!   files only once the load ends) and the CPU it spends meanwhile, until it uses less than a
//!   tenth of a core over half a second.
//!
//! Nothing is sent meanwhile: the output was checked across the crash before, and the restore
//! alone is timed.

use std::time::{Duration, Instant};

use streamapp_api::health::ProcessorHealth;

use crate::Settings;
use crate::common::*;
use crate::recovery::restore_limit;
use crate::systems::App;

/// What a full restore cost one system.
#[derive(Clone, Copy, Debug, Default)]
pub struct Restore {
    /// Changelog records restored, over every partition.
    pub records: u64,
    /// From the first partition's restore start to the last one's end.
    pub restoring_s: f64,
    /// From the process start until every partition was restored.
    pub in_service_s: f64,
    /// From the process start until it went quiet after that (see the module's doc).
    pub settled_s: f64,
    /// CPU seconds the process spent from being in service until it went quiet.
    pub cpu_after_s: f64,
}

/// A process is quiet once it uses less than this share of a core over [`QUIET_WINDOW`].
const QUIET_SHARE: f64 = 0.1;
const QUIET_WINDOW: Duration = Duration::from_millis(500);
/// How long a system is watched for going quiet after its restore at most.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// Waits until process `pid` goes quiet (see the module's doc); when that was, since
/// `started`, and the CPU seconds it spent until then.
fn settle(pid: u32, started: Instant) -> (f64, f64) {
    let from = cpu_seconds(pid);
    let (mut busy_until, mut cpu_until) = (started.elapsed(), from);
    let deadline = Instant::now() + SETTLE_LIMIT;
    while Instant::now() < deadline {
        std::thread::sleep(QUIET_WINDOW);
        let cpu = cpu_seconds(pid);
        if cpu - cpu_until < QUIET_SHARE * QUIET_WINDOW.as_secs_f64() {
            break;
        }
        (busy_until, cpu_until) = (started.elapsed(), cpu);
    }
    (busy_until.as_secs_f64(), cpu_until - from)
}

impl Restore {
    pub fn records_per_s(&self) -> f64 {
        self.records as f64 / self.restoring_s
    }
}

/// Restores: a system's report of its restores since its start, once every one of the
/// application's partitions has finished.
pub struct Finished {
    /// Changelog records restored, over every partition.
    pub records: u64,
    first_start_ms: i64,
    last_end_ms: i64,
}

/// Deletes the state of `app`'s single instance (stopped), starts it and waits until it has
/// restored every partition's store from the changelog. `loaded`: the ids in the store before
/// (a restore that gets fewer back fails the run).
pub fn full_restore(settings: &Settings, app: &App, loaded: u64) -> Restore {
    let name = app.peer.name();
    let state = instance_dir(&app.dir, SINGLE_INSTANCE).join("state");
    std::fs::remove_dir_all(&state)
        .unwrap_or_else(|e| panic!("{name}: deleting {}: {e}", state.display()));
    let started = Instant::now();
    let mut system = app.start(settings);
    let finished = system.wait_for(
        "restored into an empty state directory",
        started,
        restore_limit(loaded),
        Duration::from_millis(20),
        |s| finished_restores(s, app.partitions()),
    );
    let in_service_s = started.elapsed().as_secs_f64();
    let (settled_s, cpu_after_s) = settle(system.child.id(), started);
    system.stop();
    assert!(
        finished.records >= loaded,
        "{name}: restored {} changelog records, fewer than the {loaded} ids it held",
        finished.records
    );
    let restore = Restore {
        records: finished.records,
        restoring_s: (finished.last_end_ms - finished.first_start_ms).max(1) as f64 / 1000.0,
        in_service_s,
        settled_s,
        cpu_after_s,
    };
    println!(
        "  {name}: full restore on an empty state directory: {} changelog records in {:.2} s ({:.0} records/s), every task restored {in_service_s:.2} s after the start; busy until {settled_s:.2} s, {cpu_after_s:.2} CPU s after the restore",
        restore.records,
        restore.restoring_s,
        restore.records_per_s()
    );
    restore
}

/// The system's restores since its start, if every one of its `partitions` has finished.
fn finished_restores(system: &System, partitions: usize) -> Option<Finished> {
    match &system.kind {
        Kind::Processor { port } => {
            let (200, body) = http(*port, "GET", streamapp_api::probe::HEALTH)? else {
                return None;
            };
            let health: ProcessorHealth = serde_json::from_str(&body).ok()?;
            processor_restores(&health, partitions)
        }
        Kind::Peer { .. } => peer_restores(&system.own_log(), partitions),
    }
}

/// From the processor's health: every task restored (`finishedAtMs` set).
fn processor_restores(health: &ProcessorHealth, partitions: usize) -> Option<Finished> {
    let restores: Vec<_> = health
        .tasks
        .iter()
        .filter_map(|t| t.restore.as_ref())
        .collect();
    if health.tasks.len() != partitions || restores.len() != partitions {
        return None;
    }
    let mut finished = Finished {
        records: 0,
        first_start_ms: i64::MAX,
        last_end_ms: i64::MIN,
    };
    for restore in restores {
        finished.records += restore.records_restored;
        finished.first_start_ms = finished.first_start_ms.min(restore.started_at_ms);
        finished.last_end_ms = finished.last_end_ms.max(restore.finished_at_ms?);
    }
    Some(finished)
}

/// From the Kafka Streams peer's log of this start: a `restored` line per partition.
fn peer_restores(log: &str, partitions: usize) -> Option<Finished> {
    let report = PeerRestores::read(log);
    (report.ended == partitions && report.finished.first_start_ms <= report.finished.last_end_ms)
        .then_some(report.finished)
}

/// What the Kafka Streams peer's `StateRestoreListener` printed: lines that start with the
/// time in epoch milliseconds, `<ms> restore-start <tp> offsets a..b` and
/// `<ms> restored <tp> <n> records; total <t>`.
pub struct PeerRestores {
    /// Partitions whose restore ended.
    ended: usize,
    /// Every `restored` line's records, the first start and the last end.
    pub finished: Finished,
}

impl PeerRestores {
    pub fn read(log: &str) -> PeerRestores {
        let mut report = PeerRestores {
            ended: 0,
            finished: Finished {
                records: 0,
                first_start_ms: i64::MAX,
                last_end_ms: i64::MIN,
            },
        };
        for line in log.lines() {
            let mut words = line.split_whitespace();
            let (Some(Ok(ms)), Some(what)) = (words.next().map(str::parse::<i64>), words.next())
            else {
                continue;
            };
            match what {
                "restore-start" => {
                    report.finished.first_start_ms = report.finished.first_start_ms.min(ms);
                }
                "restored" => {
                    let Some(Ok(n)) = words.nth(1).map(str::parse::<u64>) else {
                        continue;
                    };
                    report.finished.records += n;
                    report.ended += 1;
                    report.finished.last_end_ms = report.finished.last_end_ms.max(ms);
                }
                _ => {}
            }
        }
        report
    }
}
