//! State shared by the processing threads and the HTTP server: the health report (also kept on
//! disk as the health file), readiness, the loops' progress (liveness), and the drain
//! handshake.
//!
//! With several processing threads (`processingThreads`) each reports its own part, by its
//! index: its tasks, its readiness, its progress. The process is ready when every thread is,
//! live while every thread makes progress, and its report lists all threads' tasks.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use streamapp_api::health::{DrainRequest, ProcessorHealth, ProcessorPhase, TaskHealth};
use streamapp_api::state_volume::StateDir;
use tokio::sync::watch;

use crate::health_file::HealthFileWriter;
use crate::store::OpenStores;

/// How often the health file is rewritten at most, unless the phase changes.
const HEALTH_FILE_INTERVAL: Duration = Duration::from_secs(1);

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    Drained { duration_ms: u64 },
    Failed(String),
}

pub struct Shared {
    pub state_dir: StateDir,
    /// The stores open in this process, for the lookup endpoint.
    pub open_stores: OpenStores,
    health: Mutex<Report>,
    ready: AtomicBool,
    drain_requested: AtomicBool,
    /// A processing thread failed for good: the others drain and the process exits.
    thread_failed: AtomicBool,
    drain_tx: watch::Sender<Option<DrainOutcome>>,
    /// The clock progress is measured on.
    started: Instant,
    /// Per processing thread: milliseconds after `started` of its loop's latest progress.
    progress_ms: Vec<AtomicU64>,
    health_file: HealthFileWriter,
    /// Which processing thread holds each partition's store directory (see
    /// [`Shared::claim_store`]).
    store_claims: Mutex<BTreeMap<i32, usize>>,
}

/// The health report and what it is made of.
struct Report {
    health: ProcessorHealth,
    last_write: Option<Instant>,
    /// Per processing thread: its tasks (the report lists them all, by partition).
    tasks: Vec<Vec<TaskHealth>>,
    /// Per processing thread: its readiness, `None` until it said.
    readiness: Vec<Option<Result<(), String>>>,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Shared {
    /// `threads`: how many processing threads report (at least one).
    pub fn new(state_dir: StateDir, health: ProcessorHealth, threads: usize) -> Self {
        let threads = threads.max(1);
        Shared {
            health: Mutex::new(Report {
                health,
                last_write: None,
                tasks: vec![Vec::new(); threads],
                readiness: vec![None; threads],
            }),
            ready: AtomicBool::new(false),
            drain_requested: AtomicBool::new(false),
            thread_failed: AtomicBool::new(false),
            drain_tx: watch::channel(None).0,
            started: Instant::now(),
            progress_ms: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            health_file: HealthFileWriter::start(state_dir.health_file()),
            state_dir,
            open_stores: OpenStores::default(),
            store_claims: Mutex::new(BTreeMap::new()),
        }
    }

    /// Processing thread `thread` takes partition `partition`'s store directory, unless
    /// another thread of the process still holds it: a partition that moves between two
    /// threads of one process is opened by the new one only after the old one closed it and
    /// wrote its checkpoint. Returns whether `thread` holds it now.
    pub fn claim_store(&self, partition: i32, thread: usize) -> bool {
        *self
            .store_claims
            .lock()
            .unwrap()
            .entry(partition)
            .or_insert(thread)
            == thread
    }

    /// Processing thread `thread` is done with partition `partition`'s store directory.
    pub fn release_store(&self, partition: i32, thread: usize) {
        let mut claims = self.store_claims.lock().unwrap();
        if claims.get(&partition) == Some(&thread) {
            claims.remove(&partition);
        }
    }

    /// Processing thread `thread` is done with every store directory it held (its engine
    /// stopped).
    pub fn release_stores(&self, thread: usize) {
        self.store_claims
            .lock()
            .unwrap()
            .retain(|_, t| *t != thread);
    }

    /// How many processing threads report.
    pub fn threads(&self) -> usize {
        self.progress_ms.len()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Sets processing thread `thread`'s readiness from [`crate::probes::readiness`]'s
    /// answer. The process is ready when every thread is; the reasons of those that are not go
    /// into the health report. Returns whether the process is ready.
    pub fn set_readiness(&self, thread: usize, readiness: Result<(), String>) -> bool {
        let mut report = self.health.lock().unwrap();
        report.readiness[thread] = Some(readiness);
        let (ready, reason) = overall_readiness(&report.readiness);
        let changed = report.health.not_ready_reason != reason;
        drop(report);
        let was = self.ready.swap(ready, Ordering::SeqCst);
        if changed {
            self.update(was != ready, |h| h.not_ready_reason = reason);
        }
        ready
    }

    /// Not ready, for the given reason (stopping, failed), whatever the threads say.
    pub fn set_not_ready(&self, reason: &str) {
        for thread in 0..self.threads() {
            self.set_readiness(thread, Err(reason.to_string()));
        }
    }

    /// Processing thread `thread`'s loop made progress (a poll, a restore step, a commit, a
    /// retry while waiting).
    pub fn beat(&self, thread: usize) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.progress_ms[thread].store(ms, Ordering::Relaxed);
    }

    /// Progress of every thread (start-up, before the threads run).
    pub fn beat_all(&self) {
        for thread in 0..self.threads() {
            self.beat(thread);
        }
    }

    /// Time since the latest progress of the thread that has made none for longest.
    pub fn since_progress(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        let oldest = self
            .progress_ms
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .min()
            .unwrap_or(now);
        Duration::from_millis(now.saturating_sub(oldest))
    }

    pub fn phase(&self) -> ProcessorPhase {
        self.health.lock().unwrap().health.phase
    }

    /// A copy of the current health report.
    pub fn health(&self) -> ProcessorHealth {
        self.health.lock().unwrap().health.clone()
    }

    /// Processing thread `thread`'s tasks; the report lists every thread's, by partition.
    pub fn set_tasks(&self, thread: usize, force: bool, tasks: Vec<TaskHealth>) {
        let mut report = self.health.lock().unwrap();
        report.tasks[thread] = tasks;
        let mut all: Vec<TaskHealth> = report.tasks.iter().flatten().cloned().collect();
        drop(report);
        all.sort_by_key(|t| t.partition);
        self.update(force, |h| h.tasks = all);
    }

    /// Changes the report and writes the health file: at once, returning once it is on disk,
    /// when `f` changed the phase or `force` is set; otherwise at most once per
    /// [`HEALTH_FILE_INTERVAL`], by the file's writer thread while the caller goes on.
    pub fn update(&self, force: bool, f: impl FnOnce(&mut ProcessorHealth)) {
        let mut guard = self.health.lock().unwrap();
        let Report {
            health, last_write, ..
        } = &mut *guard;
        let phase = health.phase;
        f(health);
        let due = last_write.is_none_or(|t| t.elapsed() >= HEALTH_FILE_INTERVAL);
        let at_once = force || health.phase != phase;
        if at_once || due {
            health.updated_at_ms = now_ms();
            let bytes = serde_json::to_vec_pretty(health).expect("health serialises");
            // Handed over under the lock: reports reach the writer in the order they were made.
            let number = self.health_file.write(bytes);
            *last_write = Some(Instant::now());
            drop(guard);
            if at_once {
                self.health_file.wait(number);
            }
        }
    }

    pub fn set_phase(&self, phase: ProcessorPhase) {
        self.update(true, |h| h.phase = phase);
    }

    /// Asks the processing thread to drain; returns a receiver that sees the outcome. The
    /// first request is the one the health report names.
    pub fn request_drain(&self, by: DrainRequest) -> watch::Receiver<Option<DrainOutcome>> {
        if !self.drain_requested.swap(true, Ordering::SeqCst) {
            self.update(true, |h| h.drain_requested_by = Some(by));
        }
        self.drain_tx.subscribe()
    }

    pub fn drain_requested(&self) -> bool {
        self.drain_requested.load(Ordering::SeqCst)
    }

    /// A processing thread failed for good: the others drain so that the process can exit
    /// (its supervisor starts it again).
    pub fn thread_failed(&self) {
        self.thread_failed.store(true, Ordering::SeqCst);
    }

    /// Whether the processing threads should drain and stop: a drain was asked for, or one of
    /// them failed for good.
    pub fn should_stop(&self) -> bool {
        self.drain_requested() || self.thread_failed.load(Ordering::SeqCst)
    }

    pub fn finish_drain(&self, outcome: DrainOutcome) {
        self.drain_tx.send_replace(Some(outcome));
    }

    pub fn drain_outcome(&self) -> Option<DrainOutcome> {
        self.drain_tx.borrow().clone()
    }
}

/// The process is ready when every thread said it is; otherwise the reasons of those that are
/// not (prefixed with the thread when there are several, unless all give the same one).
fn overall_readiness(threads: &[Option<Result<(), String>>]) -> (bool, Option<String>) {
    let why: Vec<(usize, &str)> = threads
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Some(Ok(())) => None,
            Some(Err(reason)) => Some((i, reason.as_str())),
            None => Some((i, "starting")),
        })
        .collect();
    let Some(&(_, first)) = why.first() else {
        return (true, None);
    };
    if why.len() == threads.len() && why.iter().all(|(_, r)| *r == first) {
        return (false, Some(first.to_string()));
    }
    let reasons: Vec<String> = why
        .iter()
        .map(|(i, r)| format!("thread {i}: {r}"))
        .collect();
    (false, Some(reasons.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_ready_only_when_every_thread_is() {
        let ok = Some(Ok(()));
        let restoring = Some(Err("partition 3 is Restoring".to_string()));
        assert_eq!(overall_readiness(std::slice::from_ref(&ok)), (true, None));
        assert_eq!(
            overall_readiness(std::slice::from_ref(&restoring)),
            (false, Some("partition 3 is Restoring".into())),
            "one thread: its reason as it is"
        );
        assert_eq!(
            overall_readiness(&[ok.clone(), restoring]),
            (false, Some("thread 1: partition 3 is Restoring".into()))
        );
        assert_eq!(
            overall_readiness(&[ok, None]),
            (false, Some("thread 1: starting".into())),
            "a thread that has not said yet holds the process back"
        );
        let draining = Some(Err("draining".to_string()));
        assert_eq!(
            overall_readiness(&[draining.clone(), draining]),
            (false, Some("draining".into())),
            "one reason for all threads is said once"
        );
    }

    #[test]
    fn a_store_directory_passes_between_threads_only_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Shared::new(
            StateDir::new(dir.path().to_str().unwrap(), None),
            ProcessorHealth::new("p", "app", 0),
            2,
        );
        assert!(shared.claim_store(3, 0));
        assert!(shared.claim_store(3, 0), "claiming again is holding");
        assert!(!shared.claim_store(3, 1), "thread 0 still holds it");
        shared.release_store(3, 1);
        assert!(!shared.claim_store(3, 1), "only the holder releases");
        shared.release_store(3, 0);
        assert!(shared.claim_store(3, 1));
        assert!(shared.claim_store(4, 1));
        shared.release_stores(1);
        assert!(shared.claim_store(3, 0) && shared.claim_store(4, 0));
    }

    #[test]
    fn liveness_follows_the_thread_that_made_no_progress_for_longest() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Shared::new(
            StateDir::new(dir.path().to_str().unwrap(), None),
            ProcessorHealth::new("p", "app", 0),
            2,
        );
        std::thread::sleep(Duration::from_millis(30));
        let beat_0 = Instant::now();
        shared.beat(0);
        assert!(
            shared.since_progress() >= Duration::from_millis(30),
            "thread 1 has not beaten since the start"
        );
        shared.beat(1);
        // Now thread 0's beat is the oldest (milliseconds: one of rounding).
        assert!(shared.since_progress() <= beat_0.elapsed() + Duration::from_millis(1));
    }
}
