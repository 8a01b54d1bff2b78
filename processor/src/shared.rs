//! State shared by the processing thread and the HTTP server: the health report (also kept on
//! disk as the health file), readiness, the loop's progress (liveness), and the drain
//! handshake.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use streamapp_api::health::{DrainRequest, ProcessorHealth, ProcessorPhase};
use tokio::sync::watch;

use crate::health_file::HealthFileWriter;
use crate::state_dir::StateDir;

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
    health: Mutex<(ProcessorHealth, Option<Instant>)>,
    ready: AtomicBool,
    drain_requested: AtomicBool,
    drain_tx: watch::Sender<Option<DrainOutcome>>,
    /// The clock progress is measured on.
    started: Instant,
    /// Milliseconds after `started` of the loop's latest progress.
    progress_ms: AtomicU64,
    health_file: HealthFileWriter,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Shared {
    pub fn new(state_dir: StateDir, health: ProcessorHealth) -> Self {
        Shared {
            health: Mutex::new((health, None)),
            ready: AtomicBool::new(false),
            drain_requested: AtomicBool::new(false),
            drain_tx: watch::channel(None).0,
            started: Instant::now(),
            progress_ms: AtomicU64::new(0),
            health_file: HealthFileWriter::start(state_dir.health_file()),
            state_dir,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Sets readiness from [`crate::probes::readiness`]'s answer; the reason goes into the
    /// health report.
    pub fn set_readiness(&self, readiness: Result<(), String>) {
        let ready = readiness.is_ok();
        let reason = readiness.err();
        let was = self.ready.swap(ready, Ordering::SeqCst);
        let changed = self.health.lock().unwrap().0.not_ready_reason != reason;
        if changed {
            self.update(was != ready, |h| h.not_ready_reason = reason);
        }
    }

    /// Not ready, for the given reason (stopping, failed).
    pub fn set_not_ready(&self, reason: &str) {
        self.set_readiness(Err(reason.to_string()));
    }

    /// The loop made progress (a poll, a restore step, a commit, a retry while waiting).
    pub fn beat(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the loop's latest progress.
    pub fn since_progress(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.progress_ms.load(Ordering::Relaxed)))
    }

    pub fn phase(&self) -> ProcessorPhase {
        self.health.lock().unwrap().0.phase
    }

    /// A copy of the current health report.
    pub fn health(&self) -> ProcessorHealth {
        self.health.lock().unwrap().0.clone()
    }

    /// Changes the report and writes the health file: at once, returning once it is on disk,
    /// when `f` changed the phase or `force` is set; otherwise at most once per
    /// [`HEALTH_FILE_INTERVAL`], by the file's writer thread while the caller goes on.
    pub fn update(&self, force: bool, f: impl FnOnce(&mut ProcessorHealth)) {
        let mut guard = self.health.lock().unwrap();
        let (health, last_write) = &mut *guard;
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

    pub fn finish_drain(&self, outcome: DrainOutcome) {
        self.drain_tx.send_replace(Some(outcome));
    }

    pub fn drain_outcome(&self) -> Option<DrainOutcome> {
        self.drain_tx.borrow().clone()
    }
}
