//! Fault injection for tests: makes the topology fail, stall or the process die at the points
//! where exactly-once is hardest to keep.
//!
//! Off unless the environment variable `STREAMAPP_FAULTS` enables it, with a budget per fault:
//! `STREAMAPP_FAULTS=fail-after-put=2,crash-after-put=1`. Production processors ignore the
//! header. Faults at a record ask with the header `streamapp.fault: <name>[:<delay ms>]`; the
//! delay is spent in the stage (the loop makes no progress meanwhile) before the fault acts:
//!
//! - `fail-after-put`: the downstream `enrich` stage fails, so the transaction aborts and the
//!   record is tried again (`topology.maxRecordAttempts` bounds how often);
//! - `crash-after-put`: the process aborts on the spot, like `kill -9` with the put staged;
//! - `stall-after-put`: the stage only takes long (the delay), then succeeds;
//! - `grow-memory-after-put`: the stage allocates memory until the kernel kills the process
//!   for exceeding its memory limit (how a real node reports an OOM kill);
//! - `crash-after-commit`: the process aborts right after the Kafka transaction holding the
//!   record committed, before its writes reach the store;
//! - `pause-before-commit`: the transaction holding the record waits for the delay once its
//!   records are delivered and its offsets sent, right before the commit is asked of the
//!   coordinator (not in the stage: a test takes the broker away in that gap);
//! - `crash-after-route`: (repartitioning only) the process aborts right after the route stage
//!   handed the record to the producer for the repartition topic, before that transaction
//!   commits.
//!
//! One fault needs no record: `crash-after-revoke` aborts the process right after a revoke
//! suspended its stores (kill -9 while suspended).
//!
//! Two act where a task's store is opened from disk (or reopened for a new role), and their
//! number is not a budget:
//! - `slow-open=<ms>`, or `slow-open-<partition>=<ms>` for one partition's store only: every
//!   open sleeps that long first (a slow disk, or a big store RocksDB takes long to open);
//! - `locked-open-<partition>=<n>`: the first `n` opens of the partition's store fail at once
//!   as if another process held its LOCK (the task backs off and retries, as with a real one).
//!
//! And one where a store is handed to the state updater to restore: `panic-in-restore=<n>`
//! makes its thread panic as it takes the store, for the first `n` restores (a defect in the
//! restore path: the engine must notice and start over, not wait for the restore forever).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use streamapp_api::health::StoreUnavailable;

use crate::store::StoreError;

pub const FAULT_HEADER: &str = "streamapp.fault";
pub const ENV: &str = "STREAMAPP_FAULTS";
const ROUTE_CRASH: &str = "crash-after-route";
const COMMIT_PAUSE: &str = "pause-before-commit";

/// A fault header's `<name>[:<delay ms>]`.
fn parse_request(requested: Option<&[u8]>) -> Option<(&str, Option<Duration>)> {
    let request = std::str::from_utf8(requested?).ok()?;
    Some(match request.split_once(':') {
        Some((name, ms)) => (name, ms.parse().ok().map(Duration::from_millis)),
        None => (request, None),
    })
}

#[derive(Debug, Default)]
pub struct Faults {
    budget: HashMap<String, u32>,
    /// A record asked to crash after its transaction commits.
    crash_after_commit: bool,
    /// A record asked its transaction to wait this long before the commit.
    pause_before_commit: Option<Duration>,
}

/// What one open of a task's store is to suffer (see the module's `slow-open` and
/// `locked-open`). Decided where the faults live, carried out where the store is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFault {
    /// Sleep this long before opening.
    pub delay: Option<Duration>,
    /// Fail at once, as if another process held the store's LOCK.
    pub locked: bool,
}

impl OpenFault {
    /// Called right before the store of `partition` at `path` is opened: fails as asked, or
    /// sleeps as asked.
    pub fn before_open(&self, partition: i32, path: &Path) -> Result<(), StoreError> {
        if self.locked {
            tracing::warn!(
                partition,
                "fault injection: the store's LOCK is held by another process"
            );
            return Err(StoreError::Unavailable {
                path: path.to_path_buf(),
                kind: StoreUnavailable::Locked,
                reason: "fault injection: lock held by another process".into(),
            });
        }
        if let Some(delay) = self.delay {
            tracing::warn!(
                partition,
                delay_ms = delay.as_millis() as u64,
                "fault injection: opening the store slowly"
            );
            std::thread::sleep(delay);
        }
        Ok(())
    }
}

/// What one restore handed to the state updater is to suffer (see the module's
/// `panic-in-restore`). Decided where the faults live, carried out on the updater's thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreFault {
    /// The state updater's thread panics as it takes the store.
    pub panic: bool,
}

impl RestoreFault {
    /// Called on the state updater's thread when it takes the store of `partition`.
    pub fn before_restore(&self, partition: i32) {
        if self.panic {
            tracing::warn!(partition, "fault injection: the state updater panics");
            panic!("a panic injected as the store of partition {partition} was taken to restore");
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Injected {
    /// The stage after the put fails: abort and retry.
    Fail,
}

impl Faults {
    pub fn from_env() -> Self {
        std::env::var(ENV)
            .map(|v| Self::parse(&v))
            .unwrap_or_default()
    }

    pub fn parse(spec: &str) -> Self {
        let budget = spec
            .split(',')
            .filter_map(|part| {
                let (name, n) = part.trim().split_once('=')?;
                Some((name.to_string(), n.parse().ok()?))
            })
            .collect();
        Faults {
            budget,
            crash_after_commit: false,
            pause_before_commit: None,
        }
    }

    fn take(&mut self, name: &str) -> bool {
        match self.budget.get_mut(name).filter(|n| **n > 0) {
            Some(left) => {
                *left -= 1;
                true
            }
            None => false,
        }
    }

    /// Whether any fault is enabled: without, a record's fault header is never looked for
    /// (a production processor does not scan every record's headers for it).
    fn armed(&self) -> bool {
        !self.budget.is_empty()
    }

    /// Called by the `enrich` stage after the store put; `requested`: the record's fault
    /// header, read only when a fault is enabled.
    pub fn after_put<'r>(
        &mut self,
        requested: impl FnOnce() -> Option<&'r [u8]>,
    ) -> Result<(), Injected> {
        if !self.armed() {
            return Ok(());
        }
        let Some((name, delay)) = parse_request(requested()) else {
            return Ok(());
        };
        if name == ROUTE_CRASH || !self.take(name) {
            return Ok(());
        }
        if name == COMMIT_PAUSE {
            self.pause_before_commit = delay;
            return Ok(());
        }
        if let Some(delay) = delay {
            tracing::warn!(
                fault = name,
                delay_ms = delay.as_millis() as u64,
                "fault injection: stalling the enrich stage"
            );
            std::thread::sleep(delay);
        }
        match name {
            "crash-after-put" => {
                tracing::warn!("fault injection: crashing after a store put");
                std::process::abort();
            }
            "grow-memory-after-put" => {
                tracing::warn!("fault injection: allocating memory until the OOM killer stops us");
                let mut held: Vec<Vec<u8>> = Vec::new();
                loop {
                    // Touched, so the pages are really in use.
                    held.push(vec![1u8; 16 << 20]);
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            "fail-after-put" => {
                tracing::warn!("fault injection: failing the enrich stage after a store put");
                Err(Injected::Fail)
            }
            "crash-after-commit" => {
                self.crash_after_commit = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Called by the route stage after it sent the record to the repartition topic;
    /// `requested` as for [`Faults::after_put`].
    pub fn after_route<'r>(&mut self, requested: impl FnOnce() -> Option<&'r [u8]>) {
        if self.armed()
            && parse_request(requested()).is_some_and(|(name, _)| name == ROUTE_CRASH)
            && self.take(ROUTE_CRASH)
        {
            tracing::warn!("fault injection: crashing after routing a record");
            std::process::abort();
        }
    }

    /// Called once a transaction's records are delivered and its offsets sent, right before
    /// the commit.
    pub fn before_commit(&mut self) {
        if let Some(pause) = self.pause_before_commit.take() {
            tracing::warn!(
                pause_ms = pause.as_millis() as u64,
                "fault injection: pausing before the commit"
            );
            std::thread::sleep(pause);
        }
    }

    /// Called after a transaction committed, before its writes are applied to the stores.
    pub fn after_commit(&mut self) {
        if std::mem::take(&mut self.crash_after_commit) {
            tracing::warn!(
                "fault injection: crashing after the Kafka commit, before the store apply"
            );
            std::process::abort();
        }
    }

    /// Called when the store of `partition` is to be opened (from disk, or again for a new
    /// role): what that open is to suffer. Takes one `locked-open` of the partition's budget.
    pub fn store_open(&mut self, partition: i32) -> OpenFault {
        if self.take(&format!("locked-open-{partition}")) {
            return OpenFault {
                delay: None,
                locked: true,
            };
        }
        let delay = self
            .budget
            .get(&format!("slow-open-{partition}"))
            .or_else(|| self.budget.get("slow-open"))
            .map(|&ms| Duration::from_millis(ms.into()));
        OpenFault {
            delay,
            locked: false,
        }
    }

    /// Called when a store is handed to the state updater to restore: what that restore is to
    /// suffer. Takes one `panic-in-restore` of the budget.
    pub fn store_restore(&mut self) -> RestoreFault {
        RestoreFault {
            panic: self.take("panic-in-restore"),
        }
    }

    /// Called after a revoke suspended the stores.
    pub fn after_revoke(&mut self) {
        if self.take("crash-after-revoke") {
            tracing::warn!("fault injection: crashing while the stores are suspended");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_only_within_their_budget_and_only_when_asked() {
        let mut f = Faults::parse("fail-after-put=2");
        assert_eq!(f.after_put(|| None), Ok(()));
        assert_eq!(f.after_put(|| Some(b"fail-after-put")), Err(Injected::Fail));
        assert_eq!(f.after_put(|| Some(b"fail-after-put")), Err(Injected::Fail));
        assert_eq!(f.after_put(|| Some(b"fail-after-put")), Ok(()));
        let mut off = Faults::default();
        assert_eq!(
            off.after_put(|| panic!("no fault enabled: the header is not read")),
            Ok(())
        );
        off.after_route(|| panic!("no fault enabled: the header is not read"));
        assert_eq!(off.store_restore(), RestoreFault::default());
        let mut panics = Faults::parse("panic-in-restore=1");
        assert_eq!(panics.store_restore(), RestoreFault { panic: true });
        assert_eq!(panics.store_restore(), RestoreFault { panic: false });
    }

    #[test]
    fn a_pause_before_the_commit_is_not_spent_in_the_stage_but_once_before_the_commit() {
        let mut f = Faults::parse("pause-before-commit=1");
        let start = std::time::Instant::now();
        assert_eq!(f.after_put(|| Some(b"pause-before-commit:50")), Ok(()));
        assert!(start.elapsed() < Duration::from_millis(50));
        f.before_commit();
        assert!(start.elapsed() >= Duration::from_millis(50));
        let again = std::time::Instant::now();
        f.before_commit();
        assert!(again.elapsed() < Duration::from_millis(50), "once");
    }

    #[test]
    fn a_fault_may_stall_the_stage_before_it_acts() {
        let mut f = Faults::parse("fail-after-put=1,stall-after-put=1");
        let start = std::time::Instant::now();
        assert_eq!(f.after_put(|| Some(b"stall-after-put:30")), Ok(()));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(
            f.after_put(|| Some(b"fail-after-put:1")),
            Err(Injected::Fail)
        );
    }

    #[test]
    fn store_opens_are_slowed_per_partition_or_all_and_fail_as_locked_within_their_budget() {
        let mut f = Faults::parse("slow-open-1=15000,locked-open-1=2,slow-open=20");
        let slow = OpenFault {
            delay: Some(Duration::from_millis(15_000)),
            locked: false,
        };
        let locked = OpenFault {
            delay: None,
            locked: true,
        };
        assert_eq!(f.store_open(1), locked, "failing ones fail at once");
        assert_eq!(f.store_open(1), locked);
        assert_eq!(f.store_open(1), slow, "the delay is no budget: every open");
        assert_eq!(f.store_open(1), slow);
        assert_eq!(
            f.store_open(0).delay,
            Some(Duration::from_millis(20)),
            "the others"
        );
        assert_eq!(Faults::default().store_open(0), OpenFault::default());
        let err = locked
            .before_open(1, Path::new("/state/tasks/1/store"))
            .unwrap_err();
        assert_eq!(
            err.fault(),
            crate::store::Fault::Unavailable(StoreUnavailable::Locked)
        );
        let start = std::time::Instant::now();
        f.store_open(0)
            .before_open(0, Path::new("/state/tasks/0/store"))
            .unwrap();
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
