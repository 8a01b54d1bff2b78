//! The dedup stage's state: its tasks (each an input partition with a lifecycle, a store and
//! the open transaction's staged writes) and the failed attempts of its records. It answers
//! the engine's two questions about a transaction: which offsets to commit
//! ([`DedupStage::to_commit`]), and what to do once it committed ([`DedupStage::committed`]:
//! only then do the staged writes reach the stores) or aborted ([`DedupStage::rewind`]).
//!
//! The lifecycle's commands (open, restore, activate, close) are carried out by the engine's
//! [`super::tasks`]; what one record does is in [`super::processing`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use streamapp_api::health::TaskHealth;

use crate::lifecycle::{Lifecycle, Phase};
use crate::open_transactions::TransactionWait;
use crate::record_attempts::RecordAttempts;
use crate::shared::now_ms;
use crate::store::{Staged, StoreError, TaskStore};
use crate::task_position::TaskPosition;

/// One task: its lifecycle and what the engine holds for it.
pub(super) struct Task {
    pub partition: i32,
    pub lifecycle: Lifecycle,
    /// The open store, unless the state updater holds it (see `Engine::in_updater`).
    pub store: Option<TaskStore>,
    /// Which store is open for the task ([`TaskStore::id`]), wherever it is.
    pub store_id: Option<u64>,
    /// The open transaction's writes, applied once it commits.
    pub staged: Staged,
    pub position: TaskPosition,
    /// The store's changelog offset is the offset of our own last commit marker (the store
    /// reflects everything before it; the marker holds no data).
    pub at_commit_marker: bool,
    pub health: TaskHealth,
    pub restore_started: Option<Instant>,
    /// When the open store's next periodic verification is due.
    pub verify_due: Option<Instant>,
    /// The task's input stands at an open transaction (looked at with the lag).
    pub input_wait: Option<TransactionWait>,
}

impl Task {
    pub fn new(partition: i32) -> Self {
        Task {
            partition,
            lifecycle: Lifecycle::default(),
            store: None,
            store_id: None,
            staged: Staged::default(),
            position: TaskPosition::default(),
            at_commit_marker: false,
            health: TaskHealth {
                partition,
                ..Default::default()
            },
            restore_started: None,
            verify_due: None,
            input_wait: None,
        }
    }

    pub fn is(&self, phase: &Phase) -> bool {
        std::mem::discriminant(&self.lifecycle.phase) == std::mem::discriminant(phase)
    }

    pub fn active(&self) -> bool {
        self.lifecycle.phase == Phase::Active
    }

    /// The task is consumed from its committed offset on.
    pub fn start_at(&mut self, committed: Option<i64>) {
        self.position = TaskPosition::starting_at(committed);
        self.health.committed_offset = committed;
    }
}

/// The dedup stage's tasks (active and standby) and its records' failed attempts.
pub(super) struct DedupStage {
    pub tasks: BTreeMap<i32, Task>,
    pub attempts: RecordAttempts,
    /// The input topic, shared by the sightings that name it as their source.
    pub input_topic: Arc<str>,
}

impl DedupStage {
    pub fn new(max_record_attempts: u32, input_topic: &str) -> Self {
        DedupStage {
            tasks: BTreeMap::new(),
            attempts: RecordAttempts::new(max_record_attempts),
            input_topic: Arc::from(input_topic),
        }
    }

    /// Whether the record at `offset` of partition `p` is the next one of an active task.
    pub fn takes(&self, p: i32, offset: i64) -> bool {
        self.tasks
            .get(&p)
            .is_some_and(|t| t.active() && t.position.takes(offset))
    }

    /// The record at `offset` of partition `p` was processed in the open transaction.
    pub fn processed(&mut self, p: i32, offset: i64) {
        if let Some(task) = self.tasks.get_mut(&p) {
            task.position.processed(offset);
        }
    }

    /// The active tasks and where the consumer reads each.
    pub fn consumed(&self) -> impl Iterator<Item = (i32, Option<i64>)> + '_ {
        self.tasks
            .values()
            .filter(|t| t.active())
            .map(|t| (t.partition, t.position.next()))
    }

    /// The offsets to commit with the open transaction.
    pub fn to_commit(&self) -> impl Iterator<Item = (i32, i64)> + '_ {
        self.tasks
            .values()
            .filter_map(|t| Some((t.partition, t.position.to_commit()?)))
    }

    /// The committed offset of each task, for the repartition purger.
    pub fn committed_offsets(&self) -> BTreeMap<i32, i64> {
        self.tasks
            .values()
            .filter_map(|t| Some((t.partition, t.position.committed()?)))
            .collect()
    }

    /// The open transaction committed, its records written `changelog_offsets` (changelog
    /// partition → highest offset): now, and only now, the staged writes reach the stores,
    /// with the offsets they reflect. Returns the stores that failed to take them (their data
    /// is safe in the changelog: the store catches up from it).
    pub fn committed(&mut self, changelog_offsets: &HashMap<i32, i64>) -> Vec<(i32, StoreError)> {
        let mut failed = Vec::new();
        for task in self.tasks.values_mut().filter(|t| t.position.is_dirty()) {
            task.staged.changelog_offset = changelog_offsets.get(&task.partition).map(|o| o + 1);
            if task.staged.changelog_offset.is_some() {
                task.at_commit_marker = true;
            }
            task.staged.input_offset = task.position.next();
            // Written on a thread of the store's own while the next transaction is processed.
            let staged = std::mem::take(&mut task.staged);
            if let Some(store) = task.store.as_mut()
                && let Err(e) = store.apply_decided(staged)
            {
                failed.push((task.partition, e));
            }
            let committed = task.position.commit();
            task.health.committed_offset = task.position.committed();
            if let Some(store) = &task.store {
                task.health.store_changelog_offset = store.meta().changelog_offset;
            }
            task.health.last_checkpoint_at_ms = Some(now_ms());
            if let Some(offset) = committed {
                self.attempts.committed(task.partition, offset);
            }
        }
        failed
    }

    /// The open transaction aborted: staged writes are dropped and every task goes back to
    /// its committed offset. Returns the active tasks that moved, with the offset the consumer
    /// must seek back to.
    pub fn rewind(&mut self) -> Vec<(i32, Option<i64>)> {
        let mut seeks = Vec::new();
        for task in self.tasks.values_mut() {
            task.staged.clear();
            if task.position.rewind() && task.active() {
                seeks.push((task.partition, task.position.next()));
            }
        }
        seeks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_attempts::{FailureKind, Verdict};

    /// A stage with an active task on each of `active` and a standby on each of `standby`.
    fn stage(active: &[i32], standby: &[i32]) -> DedupStage {
        let mut stage = DedupStage::new(3, "in");
        for (&p, phase) in active
            .iter()
            .map(|p| (p, Phase::Active))
            .chain(standby.iter().map(|p| (p, Phase::Standby)))
        {
            let mut task = Task::new(p);
            task.lifecycle.phase = phase;
            task.start_at(Some(100));
            stage.tasks.insert(p, task);
        }
        stage
    }

    #[test]
    fn only_active_tasks_take_records_and_only_those_that_moved_are_committed() {
        let mut stage = stage(&[0, 1], &[2]);
        assert!(stage.takes(0, 100));
        assert!(
            !stage.takes(0, 99),
            "before the committed offset: a stale fetch"
        );
        assert!(!stage.takes(2, 100), "a standby processes nothing");
        assert!(!stage.takes(3, 0), "not held here");
        stage.processed(1, 100);
        stage.processed(1, 101);
        assert_eq!(stage.to_commit().collect::<Vec<_>>(), vec![(1, 102)]);
        assert_eq!(
            stage.consumed().collect::<Vec<_>>(),
            vec![(0, Some(100)), (1, Some(102))]
        );
    }

    #[test]
    fn a_commit_hands_the_changelog_offsets_on_and_forgets_attempts_committed_past() {
        let mut stage = stage(&[0, 1], &[]);
        stage.processed(0, 100);
        stage.tasks.get_mut(&0).unwrap().staged.put(b"a", 5);
        stage
            .attempts
            .failed(0, 100, FailureKind::Processing, "boom".into(), false);
        stage
            .attempts
            .failed(1, 100, FailureKind::Processing, "boom".into(), false);
        let failed = stage.committed(&HashMap::from([(0, 41)]));
        assert!(failed.is_empty(), "no store to fail");
        let task = &stage.tasks[&0];
        assert!(
            task.at_commit_marker,
            "the transaction wrote to the changelog"
        );
        assert!(
            task.staged.puts.is_empty(),
            "the staged writes went to the store"
        );
        assert_eq!(task.health.committed_offset, Some(101));
        assert_eq!(
            stage.committed_offsets(),
            BTreeMap::from([(0, 101), (1, 100)])
        );
        assert_eq!(
            stage.attempts.verdict(0, 100),
            Verdict::Process,
            "committed past"
        );
        assert_ne!(
            stage.attempts.verdict(1, 100),
            Verdict::Process,
            "task 1 did not move: its record's failure still counts"
        );
        assert!(!stage.tasks[&1].at_commit_marker);
    }

    #[test]
    fn an_abort_drops_staged_writes_and_seeks_only_the_active_tasks_that_moved() {
        let mut stage = stage(&[0, 1], &[2]);
        stage.processed(0, 100);
        stage.tasks.get_mut(&0).unwrap().staged.put(b"a", 5);
        stage.tasks.get_mut(&2).unwrap().staged.put(b"b", 5);
        assert_eq!(stage.rewind(), vec![(0, Some(100))]);
        assert!(stage.tasks.values().all(|t| t.staged.puts.is_empty()));
        assert!(stage.takes(0, 100), "the aborted record comes again");
        assert_eq!(stage.to_commit().count(), 0);
    }
}
