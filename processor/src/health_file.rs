//! The health file's writer: a thread of its own that writes the report to disk (two fsyncs:
//! the file and its directory), so that neither the processing thread nor the HTTP server
//! waits for the disk once a second.
//!
//! Reports are written in the order they were handed over, and a newer one handed over before
//! an older one reached the disk replaces it (only the latest report matters). A caller that
//! must know the file says what it said — a phase change, which the agent and the drain hook
//! go by — waits for its report to be written ([`HealthFileWriter::wait`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

struct Slot {
    /// The latest report not yet written, with its number.
    next: Option<(u64, Vec<u8>)>,
    /// Number of the latest report handed over.
    handed_over: u64,
    /// Number of the latest report written (or whose write failed).
    written: u64,
    stop: bool,
}

struct Inner {
    path: PathBuf,
    slot: Mutex<Slot>,
    changed: Condvar,
    /// The last write failed (a full volume): said once, not every second.
    failing: AtomicBool,
}

pub struct HealthFileWriter {
    inner: Arc<Inner>,
}

impl HealthFileWriter {
    /// Starts the writer of the file at `path`.
    pub fn start(path: PathBuf) -> Self {
        let inner = Arc::new(Inner {
            path,
            slot: Mutex::new(Slot {
                next: None,
                handed_over: 0,
                written: 0,
                stop: false,
            }),
            changed: Condvar::new(),
            failing: AtomicBool::new(false),
        });
        let writer = inner.clone();
        std::thread::Builder::new()
            .name("health-file".into())
            .spawn(move || writer.run())
            .expect("starting the health file writer");
        HealthFileWriter { inner }
    }

    /// Hands `report` over to be written; returns at once.
    pub fn write(&self, report: Vec<u8>) -> u64 {
        let mut slot = self.inner.slot.lock().unwrap();
        slot.handed_over += 1;
        let number = slot.handed_over;
        slot.next = Some((number, report));
        self.inner.changed.notify_all();
        number
    }

    /// Waits until the report `write` numbered `number` (or a later one) is written.
    pub fn wait(&self, number: u64) {
        let mut slot = self.inner.slot.lock().unwrap();
        while slot.written < number && !slot.stop {
            slot = self.inner.changed.wait(slot).unwrap();
        }
    }
}

impl Drop for HealthFileWriter {
    fn drop(&mut self) {
        self.inner.slot.lock().unwrap().stop = true;
        self.inner.changed.notify_all();
    }
}

impl Inner {
    fn run(&self) {
        loop {
            let (number, report) = {
                let mut slot = self.slot.lock().unwrap();
                loop {
                    if let Some(next) = slot.next.take() {
                        break next;
                    }
                    if slot.stop {
                        return;
                    }
                    slot = self.changed.wait(slot).unwrap();
                }
            };
            match streamapp_api::state_volume::write_atomically(&self.path, &report) {
                Err(e) if !self.failing.swap(true, Ordering::Relaxed) => {
                    tracing::warn!(error = %e, "could not write the health file (GET /health still answers)");
                }
                Err(_) => {}
                Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                    tracing::info!("the health file is written again");
                }
                Ok(()) => {}
            }
            let mut slot = self.slot.lock().unwrap();
            slot.written = number;
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_waited_for_is_on_disk_and_the_latest_report_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        let file = HealthFileWriter::start(path.clone());
        for i in 0..100 {
            file.write(format!("report {i}").into_bytes());
        }
        let last = file.write(b"final".to_vec());
        file.wait(last);
        assert_eq!(std::fs::read(&path).unwrap(), b"final");
        // Nothing older lands after it.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(std::fs::read(&path).unwrap(), b"final");
    }

    #[test]
    fn a_failed_write_does_not_leave_its_waiter_waiting() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: the rename fails.
        let path = dir.path().join("health.json");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("occupied"), b"x").unwrap();
        let file = HealthFileWriter::start(path.clone());
        let number = file.write(b"report".to_vec());
        file.wait(number);
        assert!(path.is_dir(), "the write failed, and the waiter returned");
    }
}
