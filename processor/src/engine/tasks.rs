//! The driver side of the task lifecycle: feeding events to [`crate::lifecycle::Lifecycle`]
//! and carrying out its commands against the stores, the checkpoints, the quarantine folder
//! and the restore reader. A command that fails becomes the next event, so every failure goes
//! through the same rules.
//!
//! Work the phases ask for is done by the loop, one piece per tick: have the stores that are
//! waiting opened, take one restore step (of every restoring task at once), activate what is
//! restored, end the back-offs that are due. What may take long on a slow disk — opening a
//! store, reopening it for a new role, closing one that is not reassigned — is done by the
//! state updater's store thread ([`crate::state_updater`]) while this thread goes on
//! processing and committing; the partitions it works on are in `Engine::store_io`, and their
//! directories stay claimed until it is done.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use streamapp_api::health::{ProcessorPhase, RestoreProgress, StoreOpen, VerificationReason};
use streamapp_api::state_volume::checkpoint::{self, CheckpointEntry};
use streamapp_api::state_volume::remove_if_present;
use tracing::{error, info, warn};

use super::{Engine, EngineError, GroupConsumer};
use crate::lifecycle::{Arrival, Command, Destination, Event, Phase, Role};
use crate::metrics::Metrics;
use crate::restore::RestoreError;
use crate::shared::now_ms;
use crate::state_updater::{Checkpoint, Update};
use crate::store::{MemoryRole, StoreError, TaskStore};

impl Engine {
    /// Feeds `event` to the task's lifecycle and carries out what it says; a failed command
    /// becomes a `StoreFailed` event. Returns the failure it led to, if any (already handled:
    /// a drain reports it).
    pub(super) fn on_task_event(&mut self, p: i32, event: Event) -> Option<StoreError> {
        let mut failure = None;
        let mut next = Some(event);
        while let Some(event) = next.take() {
            let Some(task) = self.dedup.tasks.get_mut(&p) else {
                break;
            };
            let was_backing_off = task.lifecycle.backoff().is_some();
            let commands = task.lifecycle.on(event, now_ms());
            if let Some(b) = task.lifecycle.backoff()
                && !was_backing_off
            {
                warn!(partition = p, kind = ?b.kind, attempts = b.attempts, reason = %b.reason,
                    retry_in_ms = b.retry_at_ms - now_ms(), "store unavailable: backing off (nothing is quarantined)");
                if b.attempts == 1 {
                    self.metrics
                        .store_backoffs
                        .get_or_create(&Metrics::kind(b.kind))
                        .inc();
                }
            }
            for command in commands {
                if let Err(e) = self.carry_out(p, command) {
                    warn!(partition = p, error = %e, "store operation failed");
                    next = Some(Event::StoreFailed {
                        fault: e.fault(),
                        reason: e.reason().to_string(),
                    });
                    failure = Some(e);
                    break;
                }
            }
        }
        if self
            .dedup
            .tasks
            .get(&p)
            .is_some_and(|t| t.lifecycle.phase == Phase::Closed)
        {
            self.forget_task(p);
        }
        self.refresh_readiness();
        failure
    }

    fn carry_out(&mut self, p: i32, command: Command) -> Result<(), StoreError> {
        if matches!(
            command,
            Command::BeginRestore
                | Command::FollowChangelog
                | Command::FlushStore
                | Command::CloseStore
                | Command::ReleaseStore
                | Command::QuarantineStore { .. }
        ) {
            self.reclaim_store(p);
        }
        if matches!(command, Command::BeginRestore | Command::FollowChangelog) {
            self.reopen_for_role(p);
        }
        let state = self.shared.state_dir.clone();
        let store_dir = state.store_dir(p);
        let task = self.dedup.tasks.get_mut(&p).expect("task exists");
        match command {
            Command::StopConsuming => self.reassign_needed = true,
            Command::RemoveCheckpoint => remove_if_present(&state.checkpoint_file(p))
                .map_err(|e| StoreError::from_io(&store_dir, "removing the checkpoint", &e))?,
            Command::BeginRestore => {
                task.health.restore = None;
                task.restore_started = None;
            }
            // Standbys follow on the state updater until a command takes the store back.
            Command::FollowChangelog => {
                task.health.restore = None;
                if let Some(store) = task.store.take() {
                    self.updater.follow(p, store);
                    self.in_updater.insert(p);
                }
            }
            // Only at a revoke, and on this thread: the revoke finished the transaction first
            // (committed, or aborted when the assignment was lost), so none is open while the
            // flush takes, and the store is flushed before the partition may go elsewhere.
            Command::FlushStore => {
                if let Some(store) = &mut task.store {
                    store.flush()?;
                }
            }
            Command::CloseStore => {
                task.store_id = None;
                let Some(store) = task.store.take() else {
                    return Ok(());
                };
                let committed = task.position.committed();
                let checkpoint = self.checkpoint_of(p, &store, committed);
                if self.draining {
                    // A drain committed first and processes nothing more: it closes here, to
                    // report what failed.
                    store.close()?;
                    // Closed: nothing writes to it any more, so the checkpoint is the truth.
                    checkpoint::write(&checkpoint.file, &checkpoint.entries).map_err(|e| {
                        StoreError::from_io(&store_dir, "writing the checkpoint", &e)
                    })?;
                    if let Some(task) = self.dedup.tasks.get_mut(&p) {
                        task.health.last_checkpoint_at_ms = Some(now_ms());
                    }
                } else {
                    // A flush on a slow disk may take long: the store thread closes it while
                    // this one goes on; the directory is free once it says so.
                    self.store_io.insert(p);
                    self.updater.close(p, store, Some(checkpoint));
                }
            }
            Command::ReleaseStore => {
                task.store = None;
                task.store_id = None;
                task.staged.clear();
            }
            Command::QuarantineStore { reason } => {
                task.store = None;
                task.store_id = None;
                task.staged.clear();
                task.health.verification = None;
                error!(
                    partition = p,
                    reason,
                    "state store damaged: quarantining it and rebuilding from the changelog"
                );
                let q = crate::quarantine::quarantine(&state, p, &reason, now_ms())
                    .map_err(|e| StoreError::from_io(&store_dir, "quarantining the store", &e))?;
                self.metrics.quarantines.inc();
                let list = self.quarantines.entry(p).or_default();
                list.push(q);
                if list.len() > crate::quarantine::KEEP {
                    list.remove(0);
                }
            }
            Command::PruneQuarantines => {
                let unhealthy: BTreeSet<i32> = self
                    .dedup
                    .tasks
                    .values()
                    .filter(|t| !t.active())
                    .map(|t| t.partition)
                    .collect();
                if let Err(e) =
                    crate::quarantine::prune(&state, crate::quarantine::KEEP, &unhealthy)
                {
                    warn!(error = %e, "could not prune old quarantined stores");
                }
            }
        }
        Ok(())
    }

    /// Ends the back-offs that are due (their tasks open their store again).
    pub(super) fn end_backoffs(&mut self) {
        let now = now_ms();
        let due: Vec<i32> = self
            .dedup
            .tasks
            .values()
            .filter(|t| t.lifecycle.backoff().is_some_and(|b| now >= b.retry_at_ms))
            .map(|t| t.partition)
            .collect();
        for p in due {
            info!(partition = p, "retrying the store after backing off");
            self.on_task_event(p, Event::Tick { now_ms: now });
        }
    }

    /// Drops a task (its store, if still open, closes with it) and lets the other processing
    /// threads of the process have its store directory.
    pub(super) fn forget_task(&mut self, p: i32) {
        self.dedup.tasks.remove(&p);
        // A store the store thread still opens or closes keeps its directory until it is done.
        if !self.store_io.contains(&p) {
            self.shared.release_store(p, self.cfg.thread);
        }
    }

    /// The checkpoint of `store` once closed: its changelog offset and the task's committed
    /// input offset (the store's own when the task has none).
    fn checkpoint_of(&self, p: i32, store: &TaskStore, committed: Option<i64>) -> Checkpoint {
        let meta = store.meta();
        let mut entries = Vec::new();
        if let Some(o) = meta.changelog_offset {
            entries.push(CheckpointEntry {
                topic: self.cfg.changelog_topic.clone(),
                partition: p,
                offset: o,
            });
        }
        if let Some(o) = committed.or(meta.input_offset) {
            entries.push(CheckpointEntry {
                topic: self.cfg.dedup_input().to_string(),
                partition: p,
                offset: o,
            });
        }
        Checkpoint {
            file: self.shared.state_dir.checkpoint_file(p),
            entries,
        }
    }

    /// Has the stores of the tasks that wait for one opened: a suspended store is resumed at
    /// once; the others are opened from disk by the state updater's store thread (scanned in
    /// the background when they have no clean checkpoint), which may take long on a slow disk
    /// while this thread goes on processing and committing. A store another processing thread
    /// of the process still holds, or whose close is not done yet, waits until it is free.
    pub(super) fn open_next(&mut self) {
        let thread = self.cfg.thread;
        let waiting: Vec<i32> = self
            .dedup
            .tasks
            .values()
            .filter(|t| t.is(&Phase::Opening) && !self.store_io.contains(&t.partition))
            .map(|t| t.partition)
            .collect();
        for p in waiting {
            if !self.shared.claim_store(p, thread) {
                continue;
            }
            if self.dedup.tasks[&p].store.is_some() {
                self.on_task_event(p, Event::Opened(StoreOpen::Resumed));
                self.publish_tasks(true);
            } else {
                let fault = self.faults.store_open(p);
                self.store_io.insert(p);
                self.updater.open(p, self.memory_role(p), fault);
            }
        }
    }

    /// A store the store thread opened from disk arrives.
    fn on_store_opened(&mut self, p: i32, result: Result<(TaskStore, StoreOpen), StoreError>) {
        self.store_io.remove(&p);
        let destination = self.dedup.tasks.get(&p).map_or(Destination::Close, |t| {
            t.lifecycle.on_arrival(Arrival::Fresh)
        });
        let (store, how) = match (result, destination) {
            (Ok(opened), Destination::Open) => opened,
            (Ok((store, how)), _) => {
                // Nothing was written to it: whatever checkpoint it has still holds, and one
                // created empty gets one (a partition revoked while its store was being
                // created must not make the next start look like one after a crash).
                let checkpoint = crate::lifecycle::checkpoints_an_unwanted_store(how)
                    .then(|| self.checkpoint_of(p, &store, None));
                self.close_unwanted(p, store, checkpoint);
                return;
            }
            (Err(e), Destination::Open) => {
                warn!(partition = p, error = %e, "could not open the store");
                self.on_task_event(
                    p,
                    Event::StoreFailed {
                        fault: e.fault(),
                        reason: e.reason().to_string(),
                    },
                );
                self.publish_tasks(true);
                return;
            }
            (Err(e), _) => {
                warn!(partition = p, error = %e, "could not open a store no task waits for any more");
                self.release_if_unused(p);
                return;
            }
        };
        let task = self.dedup.tasks.get_mut(&p).expect("checked");
        task.store_id = Some(store.id());
        task.store = Some(store);
        self.on_task_event(p, Event::Opened(how));
        match how {
            // After an unclean stop the store is used at once (its offsets are written in the
            // same batches as its data, so it is a consistent prefix of the changelog whose
            // tail is replayed now) and scanned for damaged blocks in the background.
            StoreOpen::ReplayedTail => {
                self.start_verification(p, VerificationReason::UncleanShutdown)
            }
            StoreOpen::Resumed => {}
            _ => self.schedule_verification(p),
        }
        self.publish_tasks(true);
    }

    /// The memory budget a task's store belongs to: the standby one for standbys and
    /// warm-ups, the active one for the rest.
    fn memory_role(&self, partition: i32) -> MemoryRole {
        match self.dedup.tasks.get(&partition).map(|t| t.lifecycle.role()) {
            Some(Role::Standby { .. }) => MemoryRole::Standby,
            _ => MemoryRole::Active,
        }
    }

    /// A standby promoted to active (or an active store turned standby) keeps its files but
    /// not its memtable budget: RocksDB fixes that at open, so the store is closed (flushed:
    /// at most the standby budget's memtables) and opened again for its new role, by the
    /// store thread. The task waits without a store meanwhile (see [`Self::on_store_reopened`]).
    fn reopen_for_role(&mut self, p: i32) {
        let role = self.memory_role(p);
        let task = self.dedup.tasks.get_mut(&p).expect("task exists");
        if task.store.as_ref().is_none_or(|s| s.memory_role() == role) {
            return;
        }
        let store = task.store.take().expect("checked");
        task.store_id = None;
        let fault = self.faults.store_open(p);
        self.store_io.insert(p);
        self.updater.reopen(p, store, role, fault);
    }

    /// A store the store thread reopened for its role arrives.
    fn on_store_reopened(&mut self, p: i32, result: Result<TaskStore, StoreError>) {
        self.store_io.remove(&p);
        let role = self.memory_role(p);
        let store = match result {
            Ok(store) => store,
            Err(e) => {
                warn!(partition = p, error = %e, "could not reopen the store for its new role");
                if self
                    .dedup
                    .tasks
                    .get(&p)
                    .is_some_and(|t| t.lifecycle.store_open())
                {
                    self.on_task_event(
                        p,
                        Event::StoreFailed {
                            fault: e.fault(),
                            reason: e.reason().to_string(),
                        },
                    );
                    self.publish_tasks(true);
                } else {
                    self.release_if_unused(p);
                }
                return;
            }
        };
        let arrival = Arrival::Reopened {
            role_matches: store.memory_role() == role,
        };
        let destination = self
            .dedup
            .tasks
            .get(&p)
            .map_or(Destination::Close, |t| t.lifecycle.on_arrival(arrival));
        match destination {
            Destination::Keep | Destination::Open => {}
            Destination::Reopen => {
                let fault = self.faults.store_open(p);
                self.store_io.insert(p);
                self.updater.reopen(p, store, role, fault);
                return;
            }
            Destination::Close => {
                // It was in use: its checkpoint is written once it is closed.
                let checkpoint = self.checkpoint_of(p, &store, None);
                self.close_unwanted(p, store, Some(checkpoint));
                return;
            }
        }
        let task = self.dedup.tasks.get_mut(&p).expect("checked");
        task.store_id = Some(store.id());
        task.store = Some(store);
        // A scan of the closed store ended with it; the reopened store is scanned anew.
        if let Some(reason) = task
            .health
            .verification
            .as_ref()
            .filter(|v| v.finished_at_ms.is_none())
            .map(|v| v.reason)
        {
            self.start_verification(p, reason);
        }
        // A standby's store follows its changelog (its FollowChangelog came while it was
        // away); a restoring task's is handed to the restore by the next step.
        let task = self.dedup.tasks.get_mut(&p).expect("checked");
        if task.is(&Phase::Standby)
            && let Some(store) = task.store.take()
        {
            self.updater.follow(p, store);
            self.in_updater.insert(p);
        }
        self.publish_tasks(true);
    }

    /// Closes a store that arrived for no task on the store thread.
    fn close_unwanted(&mut self, p: i32, store: TaskStore, checkpoint: Option<Checkpoint>) {
        info!(
            partition = p,
            "closing a store opened for a task that no longer waits for it"
        );
        self.store_io.insert(p);
        self.updater.close(p, store, checkpoint);
    }

    /// The store thread closed a store: its directory is free.
    fn on_store_closed(&mut self, p: i32, result: Result<(), StoreError>) {
        self.store_io.remove(&p);
        if let Err(e) = result {
            // Nothing is lost: what it held is in the changelog, and without a checkpoint its
            // next open replays its tail and scans it.
            warn!(partition = p, error = %e, "closing the store failed");
        }
        self.release_if_unused(p);
    }

    /// Lets the other processing threads have the partition's store directory, unless a task
    /// of this engine still has it or the store thread is not done with it.
    fn release_if_unused(&mut self, p: i32) {
        if !self.dedup.tasks.contains_key(&p) && !self.store_io.contains(&p) {
            self.shared.release_store(p, self.cfg.thread);
        }
    }

    /// Waits (at most `timeout`) for the store thread to finish what it was asked to do, taking
    /// in what it reports, as a drain does before it closes the stores.
    pub(super) fn settle_store_io(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.store_io.is_empty() && Instant::now() < deadline {
            self.shared.beat(self.cfg.thread);
            if let Some(update) = self.updater.wait_update(Duration::from_millis(100))
                && let Err(e) = self.on_update(update)
            {
                warn!(error = %e, "the state updater failed while the stores settled");
            }
        }
    }

    /// Hands the stores of tasks that are to restore over to the state updater, and takes
    /// in what it reports: progress, restored stores, failures. The processing thread never
    /// reads the changelog itself.
    pub(super) fn restore_step(&mut self) -> Result<(), EngineError> {
        let ready: Vec<i32> = self
            .dedup
            .tasks
            .values()
            .filter(|t| t.is(&Phase::Restoring) && t.store.is_some())
            .map(|t| t.partition)
            .collect();
        for p in ready {
            let task = self.dedup.tasks.get_mut(&p).expect("task exists");
            let store = task.store.take().expect("filtered");
            task.restore_started = Some(Instant::now());
            let fault = self.faults.store_restore();
            self.updater.restore(p, store, fault);
            self.in_updater.insert(p);
        }
        // Standbys stay with the updater for good: only restores make the process Restoring.
        let restoring = self.in_updater.iter().any(|p| {
            self.dedup
                .tasks
                .get(p)
                .is_some_and(|t| !t.is(&Phase::Standby))
        });
        if restoring && self.shared.phase() != ProcessorPhase::Restoring {
            self.shared.set_phase(ProcessorPhase::Restoring);
        }
        let mut changed = false;
        let mut any_done = false;
        while let Some(update) = self.updater.next_update() {
            changed = true;
            any_done |= self.on_update(update)?;
        }
        // Restore progress is what the agent reports during a restore: publish it as it comes,
        // not only on the timer.
        if changed {
            self.publish_tasks(any_done);
        }
        Ok(())
    }

    /// Takes in one update of the state updater; `Ok(true)`: a restore finished.
    fn on_update(&mut self, update: Update) -> Result<bool, EngineError> {
        let mut done = false;
        match update {
            Update::Began {
                partition: p,
                from,
                to_restore,
            } => {
                if let Some(task) = self
                    .dedup
                    .tasks
                    .get_mut(&p)
                    .filter(|t| t.is(&Phase::Standby))
                {
                    info!(partition = p, from = ?from, behind = to_restore, "standby follows the changelog");
                    task.health.store_changelog_offset = from;
                    return Ok(false);
                }
                info!(partition = p, from = ?from, to_restore, "restoring store from the changelog");
                if let Some(task) = self.dedup.tasks.get_mut(&p) {
                    task.health.restore = Some(RestoreProgress {
                        records_restored: 0,
                        records_to_restore: to_restore,
                        started_at_ms: now_ms(),
                        finished_at_ms: None,
                        waiting_for_transaction_at: None,
                    });
                }
            }
            Update::Progress {
                partition: p,
                restored,
                changelog_offset,
            } => match self.dedup.tasks.get_mut(&p) {
                // What a standby applies is not a restore (the restore metrics count what
                // a task waited for).
                Some(task) if task.is(&Phase::Standby) => {
                    task.health.store_changelog_offset = changelog_offset;
                }
                _ => self.on_restored(p, restored, changelog_offset, false),
            },
            Update::Restored {
                partition: p,
                restored,
                store,
            } => {
                let offset = store.meta().changelog_offset;
                if self.give_back(p, store) {
                    self.on_restored(p, restored, offset, true);
                    done = true;
                }
            }
            Update::Failed {
                partition: p,
                store,
                error,
            } => {
                if self.give_back(p, store) {
                    self.on_restore_failed(p, error)?;
                }
            }
            Update::Waiting {
                partition: p,
                for_transaction_at,
            } => {
                if let Some(progress) = self
                    .dedup
                    .tasks
                    .get_mut(&p)
                    .and_then(|t| t.health.restore.as_mut())
                {
                    progress.waiting_for_transaction_at = for_transaction_at;
                }
            }
            Update::Skipped {
                partition: p,
                skipped,
            } => {
                warn!(
                    partition = p,
                    records = skipped.records,
                    last_offset = skipped.last_offset,
                    last_reason = skipped.last_reason,
                    "skipped changelog records this processor cannot read (it did not write them)"
                );
                self.metrics
                    .changelog_records_skipped
                    .inc_by(skipped.records);
                self.shared.update(false, |h| {
                    h.skipped_changelog_records += skipped.records;
                    h.last_skipped_changelog_record = Some(format!(
                        "{p}/{}: {}",
                        skipped.last_offset, skipped.last_reason
                    ));
                });
            }
            Update::ReaderFailed { error, stores } => {
                for (p, store) in stores {
                    self.give_back(p, store);
                }
                return Err(error.into());
            }
            Update::Panicked { thread } => return Err(EngineError::UpdaterPanicked { thread }),
            Update::Opened { partition, result } => self.on_store_opened(partition, result),
            Update::Reopened { partition, result } => self.on_store_reopened(partition, result),
            Update::Closed { partition, result } => self.on_store_closed(partition, result),
        }
        Ok(done)
    }

    /// A store the state updater hands back goes to its task. Returns false if the task is
    /// gone (the store is closed by dropping it).
    fn give_back(&mut self, p: i32, store: TaskStore) -> bool {
        self.in_updater.remove(&p);
        match self.dedup.tasks.get_mut(&p) {
            Some(task) => {
                task.store = Some(store);
                true
            }
            None => false,
        }
    }

    /// Takes the task's store back from the state updater, if it has it (before anything
    /// else touches the store: a flush, a close, a quarantine, a new restore).
    fn reclaim_store(&mut self, p: i32) {
        if !self.in_updater.remove(&p) {
            return;
        }
        let store = self.updater.take(p);
        if let (Some(task), Some(store)) = (self.dedup.tasks.get_mut(&p), store) {
            task.store = Some(store);
        }
    }

    /// `n` more records restored into the task's store, whose changelog offset is now
    /// `offset`; `done`: it caught up.
    fn on_restored(&mut self, p: i32, n: u64, offset: Option<i64>, done: bool) {
        self.metrics.restore_records.inc_by(n);
        let Some(task) = self.dedup.tasks.get_mut(&p) else {
            return;
        };
        task.health.store_changelog_offset = offset;
        let Some(progress) = task.health.restore.as_mut() else {
            return;
        };
        progress.records_restored += n;
        if done {
            let seconds = task
                .restore_started
                .map_or(0.0, |s| s.elapsed().as_secs_f64());
            self.metrics.restore_seconds.inc_by(seconds);
            progress.finished_at_ms = Some(now_ms());
            info!(
                partition = p,
                restored = progress.records_restored,
                seconds,
                changelog_offset = ?offset,
                "store restored"
            );
            self.on_task_event(p, Event::CaughtUp);
        }
    }

    /// A restore failed: damage and store failures go through the lifecycle; a Kafka error
    /// stops the engine.
    fn on_restore_failed(&mut self, p: i32, e: RestoreError) -> Result<(), EngineError> {
        let (fault, reason) = match e {
            RestoreError::Store(e) => (e.fault(), e.reason().to_string()),
            e @ RestoreError::AheadOfChangelog { .. } => {
                (crate::store::Fault::Damaged, e.to_string())
            }
            e => return Err(e.into()),
        };
        self.on_task_event(p, Event::StoreFailed { fault, reason });
        Ok(())
    }

    /// Adds restored tasks, and route tasks not consumed from yet, to the consumer's
    /// assignment at their committed offsets. The open transaction is committed first so every
    /// position is a committed one.
    pub(super) fn activate_restored(
        &mut self,
        consumer: &GroupConsumer,
    ) -> Result<(), EngineError> {
        self.commit(consumer)?;
        let restored: Vec<i32> = self
            .dedup
            .tasks
            .values()
            .filter(|t| t.is(&Phase::Restored))
            .map(|t| t.partition)
            .collect();
        let routes = self.routes.waiting();
        if restored.is_empty() && routes.is_empty() {
            return Ok(());
        }
        let dedup_input = self.cfg.dedup_input().to_string();
        let mut tpl = TopicPartitionList::new();
        for &p in &restored {
            tpl.add_partition(&dedup_input, p);
        }
        for &p in &routes {
            tpl.add_partition(&self.cfg.topology.input_topic, p);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(30))
            .map_err(|e| EngineError::Fatal(format!("fetching committed offsets: {e}")))?;
        // An error of one partition (an offset still part of a transaction, say) comes back as
        // that partition's entry with no offset, which would read "nothing committed" and
        // start the partition from its beginning: the engine starts again instead.
        if let Some(e) = committed.elements().iter().find(|e| e.error().is_err()) {
            return Err(EngineError::Fatal(format!(
                "fetching the committed offset of {} partition {}: {:?}",
                e.topic(),
                e.partition(),
                e.error()
            )));
        }
        let committed_at = |topic: &str, p: i32| {
            committed
                .find_partition(topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
        };
        for &p in &routes {
            let offset = committed_at(&self.cfg.topology.input_topic, p);
            self.routes.activate(p, offset);
            info!(partition = p, offset = ?offset, "route task active");
        }
        for &p in &restored {
            let offset = committed_at(&dedup_input, p);
            let task = self.dedup.tasks.get_mut(&p).expect("task exists");
            task.start_at(offset);
            self.on_task_event(p, Event::Activated);
            info!(partition = p, offset = ?offset, "task active");
        }
        self.reassign(consumer);
        self.publish_tasks(true);
        self.refresh_readiness();
        Ok(())
    }
}
