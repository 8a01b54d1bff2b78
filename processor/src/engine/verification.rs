//! The engine's side of the background store verifier ([`crate::store::Verifier`]): which
//! store is scanned when (after an unclean stop, then every verification interval), and what
//! a finished scan means for its task. Damage goes through the lifecycle like any store
//! failure: the open transaction is aborted (it may have read the store), the store is
//! quarantined and rebuilt from the changelog.

use std::time::{Duration, Instant};

use streamapp_api::health::{StoreVerification, VerificationReason};
use tracing::{error, info};

use super::{Engine, GroupConsumer};
use crate::lifecycle::Event;
use crate::metrics::Metrics;
use crate::shared::now_ms;

impl Engine {
    /// The verification interval; `None`: scans only after an unclean stop.
    fn verify_interval(&self) -> Option<Duration> {
        match self.cfg.rocksdb.verify_interval_seconds {
            0 => None,
            s => Some(Duration::from_secs(s)),
        }
    }

    /// Queues a scan of the task's open store.
    pub(super) fn start_verification(&mut self, p: i32, reason: VerificationReason) {
        let Some(task) = self.dedup.tasks.get_mut(&p) else {
            return;
        };
        let Some(store) = &task.store else { return };
        task.verify_due = None;
        task.health.verification = Some(StoreVerification {
            reason,
            started_at_ms: now_ms(),
            finished_at_ms: None,
            keys: 0,
        });
        self.verifier.verify(p, store, reason);
    }

    /// The next periodic scan of a task whose store was just opened (or scanned).
    pub(super) fn schedule_verification(&mut self, p: i32) {
        let due = self.verify_interval().map(|i| Instant::now() + i);
        if let Some(task) = self.dedup.tasks.get_mut(&p) {
            task.verify_due = due;
        }
    }

    /// Starts the periodic scans that are due (tasks with an open store only).
    pub(super) fn start_due_verifications(&mut self) {
        let now = Instant::now();
        let due: Vec<i32> = self
            .dedup
            .tasks
            .values()
            .filter(|t| t.store.is_some() && t.verify_due.is_some_and(|d| now >= d))
            .map(|t| t.partition)
            .collect();
        for p in due {
            self.start_verification(p, VerificationReason::Periodic);
        }
    }

    /// Takes the finished scans: a passed one is reported, damage quarantines the store.
    pub(super) fn take_verifications(&mut self, consumer: &GroupConsumer) {
        while let Some(outcome) = self.verifier.next_outcome() {
            let p = outcome.partition;
            let Some(task) = self.dedup.tasks.get_mut(&p) else {
                continue;
            };
            if task.store_id != Some(outcome.store_id) {
                continue; // about a store this task no longer has
            }
            let seconds = outcome.elapsed.as_secs_f64();
            match outcome.result {
                // The store was closed before the scan ended; its successor is scanned anew.
                None => {}
                Some(Ok(keys)) => {
                    info!(partition = p, keys, seconds, reason = ?outcome.reason,
                        "store verified in the background");
                    if let Some(v) = task.health.verification.as_mut() {
                        v.finished_at_ms = Some(now_ms());
                        v.keys = keys;
                    }
                    self.metrics
                        .store_verifications
                        .get_or_create(&Metrics::outcome("passed"))
                        .inc();
                    self.schedule_verification(p);
                    self.publish_tasks(true);
                }
                Some(Err(e)) => {
                    error!(partition = p, error = %e, reason = ?outcome.reason,
                        "the background verification found the store damaged");
                    let label = match e.fault() {
                        crate::store::Fault::Damaged => "damaged",
                        crate::store::Fault::Unavailable(_) => "unavailable",
                    };
                    self.metrics
                        .store_verifications
                        .get_or_create(&Metrics::outcome(label))
                        .inc();
                    // Records of the open transaction may have been decided with this store.
                    self.abort(consumer, "state store damaged");
                    self.on_task_event(
                        p,
                        Event::StoreFailed {
                            fault: e.fault(),
                            reason: e.reason().to_string(),
                        },
                    );
                    self.publish_tasks(true);
                }
            }
        }
    }
}
