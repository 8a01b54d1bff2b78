//! The background verifier: a thread that reads every key of a store with checksums verified,
//! in chunks and at a bounded rate, while the processing thread goes on using the store.
//!
//! Why this is safe to do after the store is already in use: RocksDB verifies the checksum of
//! every block a lookup reads, so a damaged block can fail a lookup (which quarantines the
//! store) but never answer one wrongly, and a missing SST file fails the open. The scan only
//! finds damage early, in blocks no lookup has touched yet; it no longer holds recovery back
//! for a time that grows with the store.
//!
//! The verifier holds a store's database only for one chunk at a time, through a weak handle:
//! a store that is closed, released or quarantined meanwhile ends its scan (see
//! [`super::TaskStore`]'s `Drop`). Each result names the store it scanned ([`TaskStore::id`]),
//! so the engine ignores results about a store it no longer has.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rocksdb::{DB, Direction, IteratorMode, ReadOptions};
use streamapp_api::health::VerificationReason;
use tracing::warn;

use super::{Result, StoreError, TaskStore};

/// Keys read per chunk: the longest the verifier holds a store (a few milliseconds).
const CHUNK: usize = 10_000;

/// One store to scan.
struct Job {
    partition: i32,
    store_id: u64,
    reason: VerificationReason,
    db: Weak<DB>,
    closing: Arc<AtomicBool>,
    path: PathBuf,
}

/// What a scan found.
#[derive(Debug)]
pub struct VerifyOutcome {
    pub partition: i32,
    pub store_id: u64,
    pub reason: VerificationReason,
    /// Keys read, or the damage (or I/O error) found. `None`: the store was closed first.
    pub result: Option<Result<u64>>,
    pub elapsed: Duration,
}

/// The verifier thread and its two queues.
pub struct Verifier {
    jobs: Option<Sender<Job>>,
    stopping: Arc<AtomicBool>,
    outcomes: Receiver<VerifyOutcome>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Verifier {
    /// Starts the thread; it reads `keys_per_second` keys at most, over all stores.
    pub fn start(keys_per_second: u64) -> Self {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (outcome_tx, outcomes) = mpsc::channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("store-verifier".into())
            .spawn(move || {
                let pace = Pace::new(keys_per_second.max(1));
                for job in job_rx {
                    let started = Instant::now();
                    let result = run(&job, &pace, &stop);
                    let outcome = VerifyOutcome {
                        partition: job.partition,
                        store_id: job.store_id,
                        reason: job.reason,
                        result,
                        elapsed: started.elapsed(),
                    };
                    if outcome_tx.send(outcome).is_err() {
                        return; // the engine is gone
                    }
                }
            })
            .expect("spawning the store verifier");
        Verifier {
            jobs: Some(jobs),
            stopping,
            outcomes,
            thread: Some(thread),
        }
    }

    /// Queues a scan of `store` (scans run one after another).
    pub fn verify(&self, partition: i32, store: &TaskStore, reason: VerificationReason) {
        let job = Job {
            partition,
            store_id: store.id,
            reason,
            db: Arc::downgrade(&store.database.db),
            closing: store.closing.clone(),
            path: store.database.path.clone(),
        };
        if let Some(jobs) = &self.jobs
            && jobs.send(job).is_err()
        {
            warn!(
                partition,
                "the store verifier has stopped; the store is not scanned"
            );
        }
    }

    /// The next finished scan, if any.
    pub fn next_outcome(&self) -> Option<VerifyOutcome> {
        self.outcomes.try_recv().ok()
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst); // abandons the current scan
        self.jobs.take(); // ends the thread's loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Keeps the reading rate at `keys_per_second`.
struct Pace {
    keys_per_second: u64,
}

impl Pace {
    fn new(keys_per_second: u64) -> Self {
        Pace { keys_per_second }
    }

    /// Sleeps until `keys` keys read since `started` are within the rate, in short naps so
    /// that a scan whose store goes away (or a verifier that stops) ends at once. Returns
    /// false if `go_on` said to stop.
    fn wait(&self, started: Instant, keys: u64, go_on: impl Fn() -> bool) -> bool {
        let due = started + Duration::from_secs_f64(keys as f64 / self.keys_per_second as f64);
        loop {
            if !go_on() {
                return false;
            }
            let now = Instant::now();
            if now >= due {
                return true;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(20)));
        }
    }
}

/// Scans the job's store chunk by chunk. `None` when the store was closed before the end.
fn run(job: &Job, pace: &Pace, stopping: &AtomicBool) -> Option<Result<u64>> {
    let go_on = || {
        !stopping.load(Ordering::SeqCst)
            && !job.closing.load(Ordering::SeqCst)
            && job.db.strong_count() > 0
    };
    let started = Instant::now();
    let mut keys = 0u64;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let db = job.db.upgrade()?;
        if !go_on() {
            return None;
        }
        let (n, last) = match scan(&db, &job.path, after.as_deref(), CHUNK) {
            Ok(chunk) => chunk,
            Err(e) => return Some(Err(e)),
        };
        drop(db);
        keys += n;
        match last {
            Some(last) => after = Some(last),
            None => return Some(Ok(keys)),
        }
        if !pace.wait(started, keys, go_on) {
            return None;
        }
    }
}

/// Reads up to `limit` keys after `after` (from the start when `None`) with checksums
/// verified, without filling the block cache. Returns how many were read and, when it stopped
/// at `limit`, the last one (where the next chunk starts).
fn scan(
    db: &DB,
    path: &Path,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<(u64, Option<Vec<u8>>)> {
    let mut ro = ReadOptions::default();
    ro.set_verify_checksums(true);
    ro.fill_cache(false);
    let mode = match after {
        None => IteratorMode::Start,
        Some(key) => IteratorMode::From(key, Direction::Forward),
    };
    let mut n = 0u64;
    for item in db.iterator_opt(mode, ro) {
        let (key, _) = item.map_err(|e| StoreError::from_rocksdb(path, e))?;
        if after == Some(&*key) {
            continue; // the previous chunk's last key
        }
        n += 1;
        if n as usize >= limit {
            return Ok((n, Some(key.into_vec())));
        }
    }
    Ok((n, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Staged;

    fn open(dir: &Path) -> TaskStore {
        crate::store::tests::try_open(dir, &crate::store::tests::changelog(0)).unwrap()
    }

    fn fill(store: &mut TaskStore, ids: usize) {
        let now = crate::shared::now_ms();
        let mut staged = Staged::default();
        for i in 0..ids {
            staged.put(format!("id-{i:06}").as_bytes(), now);
        }
        staged.changelog_offset = Some(ids as i64);
        store.apply(&staged).unwrap();
    }

    fn wait(verifier: &Verifier) -> VerifyOutcome {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(o) = verifier.next_outcome() {
                return o;
            }
            assert!(Instant::now() < deadline, "no outcome");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn chunks_add_up_to_every_key_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        fill(&mut store, 25_001); // one key per id, plus metadata: several chunks
        let (whole, _) = scan(&store.database.db, &store.database.path, None, usize::MAX).unwrap();
        assert!(whole > 25_001, "{whole}");
        let verifier = Verifier::start(u64::MAX / 2);
        verifier.verify(0, &store, VerificationReason::Periodic);
        let outcome = wait(&verifier);
        assert_eq!(outcome.store_id, store.id());
        assert_eq!(outcome.result.unwrap().unwrap(), whole);
    }

    #[test]
    fn a_store_dropped_mid_scan_ends_the_scan_and_is_closed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        fill(&mut store, 50_000);
        // 1000 keys a second: the scan would take minutes.
        let verifier = Verifier::start(1000);
        verifier.verify(0, &store, VerificationReason::UncleanShutdown);
        std::thread::sleep(Duration::from_millis(100));
        let dropped = Instant::now();
        drop(store);
        assert!(dropped.elapsed() < Duration::from_secs(5));
        // Closed for good: the same process can open it again (RocksDB's lock is released).
        let again = open(dir.path());
        let outcome = wait(&verifier);
        assert!(
            dropped.elapsed() < Duration::from_secs(2),
            "the scan ended at once"
        );
        assert!(outcome.result.is_none(), "abandoned: {outcome:?}");
        assert_ne!(outcome.store_id, again.id());
    }

    #[test]
    fn the_rate_bounds_how_fast_a_store_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        fill(&mut store, 30_000); // one key per id: 30k keys
        let verifier = Verifier::start(20_000);
        let started = Instant::now();
        verifier.verify(0, &store, VerificationReason::Periodic);
        let keys = wait(&verifier).result.unwrap().unwrap();
        // Three full chunks are paced (a last, partial one ends the scan without a wait).
        let paced = (keys / CHUNK as u64) * CHUNK as u64;
        let floor = Duration::from_secs_f64(paced as f64 / 20_000.0);
        assert!(
            started.elapsed() >= floor,
            "{:?} < {floor:?}",
            started.elapsed()
        );
    }
}
