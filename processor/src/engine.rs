//! The exactly-once processing loop.
//!
//! One consumer (group = application id, static membership = pod name, read_committed) and one
//! transactional producer (transactional.id = `<application id>-<pod name>`) per process. Each
//! assigned input partition is a task with its own store. A transaction spans all tasks and
//! carries output, duplicates, dead letters, changelog records and the consumer offsets; it is
//! committed every commit interval. Only after the commit succeeded are the staged writes
//! applied to the stores (with their changelog offsets, atomically). An abort drops them and
//! rewinds the consumer to the committed positions.
//!
//! Partitions are added to the consumer's local assignment only once their store is restored
//! (the group assignment callback registers them, the loop restores them step by step and then
//! assigns them with their committed offsets), so no record is ever processed against a store
//! that is not caught up.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use streamapp_api::config::{DedupId, ResolvedRocksDb};
use streamapp_api::health::{ProcessorPhase, RestoreProgress, StoreOpen, TaskHealth};
use tracing::{debug, error, info, warn};

use crate::checkpoint::{self, CheckpointEntry};
use crate::faults::{FAULT_HEADER, Faults};
use crate::metrics::Metrics;
use crate::restore::{Restorer, Step};
use crate::shared::{DrainOutcome, Shared, now_ms};
use crate::store::{SharedMemory, StoreError, TaskStore};
use crate::topology::{self, RecordView, Rejection};

/// Timeout of each transactional call; retriable errors are retried until [`TXN_DEADLINE`].
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(10);
const TXN_DEADLINE: Duration = Duration::from_secs(120);
/// How often task statistics (store size, WAL files) are refreshed for the health report.
const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);
/// Changelog records restored per loop iteration before the consumer is polled again.
const RESTORE_STEP: usize = 50_000;

/// Why the engine stopped.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Another process with the same pod identity took over: this one must stop.
    #[error(
        "fenced: another processor with transactional.id {transactional_id} (the same pod identity) took over; \
         this instance stops so that only one writes ({detail})"
    )]
    Fenced {
        transactional_id: String,
        detail: String,
    },
    /// The producer or consumer is unusable; the process restarts its engine (or exits).
    #[error("fatal Kafka error: {0}")]
    Fatal(String),
    #[error(transparent)]
    Restore(#[from] crate::restore::RestoreError),
    #[error("state store: {0}")]
    Store(String),
}

/// What the engine needs to know, resolved from the configuration.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub application_id: String,
    pub pod: String,
    pub input_topic: String,
    pub output_topic: String,
    pub duplicates_topic: Option<String>,
    pub dead_letter_topic: String,
    pub changelog_topic: String,
    pub dedup_id: DedupId,
    pub retention: Duration,
    pub commit_interval: Duration,
    pub max_value_bytes: u64,
    pub rocksdb: ResolvedRocksDb,
    /// Client properties shared by consumer and producer (bootstrap, security, user extras).
    pub client: ClientConfig,
}

impl EngineConfig {
    pub fn transactional_id(&self) -> String {
        format!("{}-{}", self.application_id, self.pod)
    }
}

/// Producer callbacks: remembers the offsets the changelog records of the open transaction got.
#[derive(Default)]
pub struct DeliveryTracker {
    changelog_topic: String,
    /// Changelog partition → highest offset delivered in the open transaction.
    changelog_offsets: Mutex<HashMap<i32, i64>>,
    failure: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) if m.topic() == self.changelog_topic => {
                let mut offsets = self.changelog_offsets.lock().unwrap();
                let e = offsets.entry(m.partition()).or_insert(m.offset());
                *e = (*e).max(m.offset());
            }
            Ok(_) => {}
            Err((e, m)) => {
                *self.failure.lock().unwrap() =
                    Some(format!("delivery to {} failed: {e}", m.topic()));
            }
        }
    }
}

impl DeliveryTracker {
    fn take_offsets(&self) -> HashMap<i32, i64> {
        std::mem::take(&mut self.changelog_offsets.lock().unwrap())
    }
    fn clear(&self) {
        self.changelog_offsets.lock().unwrap().clear();
        self.failure.lock().unwrap().take();
    }
}

/// Consumer callbacks: the group's assignment changes go to the engine.
pub struct GroupContext {
    engine: Arc<Mutex<Engine>>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let mut engine = self.engine.lock().unwrap();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                engine.on_assigned(consumer, &partitions);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let lost = consumer.assignment_lost();
                engine.on_revoked(consumer, lost);
            }
            other => {
                warn!(error = ?other, "rebalance error; dropping the assignment");
                engine.on_revoked(consumer, true);
            }
        }
    }
}

pub type GroupConsumer = BaseConsumer<GroupContext>;

enum TaskPhase {
    /// Store open; changelog tail to replay.
    Restoring { started: Instant },
    /// Restored; waiting to be added to the consumer's assignment.
    Restored,
    /// Processing.
    Active,
}

struct Task {
    partition: i32,
    store: TaskStore,
    phase: TaskPhase,
    staged: crate::store::Staged,
    /// Next input offset to process (the consumer position as the engine sees it).
    position: Option<i64>,
    /// Next input offset as of the last committed transaction.
    committed: Option<i64>,
    /// The open transaction processed records of this task.
    dirty: bool,
    /// The store's changelog offset is the offset of our own last commit marker (the store
    /// reflects everything before it; the marker holds no data).
    at_commit_marker: bool,
    health: TaskHealth,
}

/// The processing state of one process. Lives behind a mutex shared with the consumer's
/// rebalance callback, which runs inside `poll` on the same thread.
pub struct Engine {
    cfg: EngineConfig,
    producer: BaseProducer<DeliveryTracker>,
    tasks: BTreeMap<i32, Task>,
    /// Stores of revoked tasks, kept open in case the next assignment brings them back.
    suspended: BTreeMap<i32, TaskStore>,
    txn_started: Option<Instant>,
    restorer: Restorer,
    memory: SharedMemory,
    shared: Arc<Shared>,
    metrics: Metrics,
    faults: Faults,
    /// An error raised inside a callback, returned by the next `tick`.
    pending_error: Option<EngineError>,
    /// Quarantines per partition during this process's life (newest last, bounded).
    quarantines: BTreeMap<i32, Vec<streamapp_api::health::Quarantine>>,
    last_publish: Instant,
    drained: bool,
}

impl Engine {
    /// Creates the transactional producer (fencing any older instance with the same identity)
    /// and the engine, and the group consumer wired to it.
    pub fn start(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        metrics: Metrics,
        faults: Faults,
    ) -> Result<(Arc<Mutex<Engine>>, GroupConsumer), EngineError> {
        let fatal = |what: &str, e: KafkaError| EngineError::Fatal(format!("{what}: {e}"));
        let tracker = DeliveryTracker {
            changelog_topic: cfg.changelog_topic.clone(),
            ..Default::default()
        };
        let producer: BaseProducer<DeliveryTracker> = cfg
            .client
            .clone()
            .set("transactional.id", cfg.transactional_id())
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            // Bounded buffers: the operator's memory budget counts on them.
            .set("queue.buffering.max.kbytes", "65536")
            .create_with_context(tracker)
            .map_err(|e| fatal("creating the producer", e))?;
        // Aborts whatever a previous incarnation left open and fences it.
        retry_txn(&cfg, || producer.init_transactions(TXN_CALL_TIMEOUT)).map_err(|e| match e {
            TxnError::Fenced(d) => EngineError::Fenced {
                transactional_id: cfg.transactional_id(),
                detail: d,
            },
            TxnError::Abortable(d) | TxnError::Fatal(d) => {
                EngineError::Fatal(format!("init_transactions: {d}"))
            }
        })?;
        let restorer = Restorer::new(&cfg.client, &cfg.changelog_topic)
            .map_err(|e| fatal("creating the restore consumer", e))?;
        let memory = SharedMemory::new(&cfg.rocksdb);
        let engine = Arc::new(Mutex::new(Engine {
            cfg: cfg.clone(),
            producer,
            tasks: BTreeMap::new(),
            suspended: BTreeMap::new(),
            txn_started: None,
            restorer,
            memory,
            shared,
            metrics,
            faults,
            pending_error: None,
            quarantines: BTreeMap::new(),
            last_publish: Instant::now(),
            drained: false,
        }));
        let consumer: GroupConsumer = cfg
            .client
            .clone()
            .set("group.id", &cfg.application_id)
            .set("group.instance.id", &cfg.pod)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "range")
            .set("queued.max.messages.kbytes", "16384")
            .create_with_context(GroupContext {
                engine: engine.clone(),
            })
            .map_err(|e| fatal("creating the consumer", e))?;
        consumer
            .subscribe(&[&cfg.input_topic])
            .map_err(|e| fatal("subscribing", e))?;
        Ok((engine, consumer))
    }

    // ---- group membership -------------------------------------------------------------

    fn on_assigned(&mut self, consumer: &GroupConsumer, partitions: &[i32]) {
        info!(?partitions, "partitions assigned");
        // Stores of revoked tasks that did not come back are closed now.
        let keep: Vec<i32> = partitions.to_vec();
        self.suspended.retain(|p, _| keep.contains(p));
        for &p in partitions {
            if self.tasks.contains_key(&p) {
                continue;
            }
            let store = match self.suspended.remove(&p) {
                Some(store) => Ok((store, StoreOpen::ReplayedTail)),
                None => self.open_store(p),
            };
            match store {
                Ok((store, opened)) => self.add_restoring_task(p, store, opened),
                Err(e) => {
                    self.pending_error = Some(e);
                    return;
                }
            }
        }
        // Only restored tasks are consumed from; the new ones join once restored.
        self.reassign(consumer);
        self.publish_tasks(true);
    }

    fn on_revoked(&mut self, consumer: &GroupConsumer, lost: bool) {
        info!(lost, tasks = self.tasks.len(), "partitions revoked");
        if self.drained {
            // Drained (checkpoints written) or stopped on an error: only let go.
            let _ = consumer.unassign();
            return;
        }
        if lost {
            self.abort(consumer, "assignment lost");
        } else if let Err(e) = self.commit(consumer) {
            self.pending_error = Some(e);
        }
        for (p, task) in std::mem::take(&mut self.tasks) {
            if matches!(task.phase, TaskPhase::Active)
                && !lost
                && let Err(e) = self.close_cleanly(&task)
            {
                warn!(partition = p, error = %e, "could not flush and checkpoint a revoked task");
            }
            self.suspended.insert(p, task.store);
        }
        self.restorer.finish();
        let _ = consumer.unassign();
        self.shared.set_ready(false);
        self.publish_tasks(true);
    }

    /// Opens the store of `partition`; a damaged one is quarantined and replaced by an empty
    /// store that is rebuilt from the changelog.
    fn open_store(&mut self, partition: i32) -> Result<(TaskStore, StoreOpen), EngineError> {
        let state = &self.shared.state_dir;
        let existed = state.store_dir(partition).join("CURRENT").exists();
        let clean = checkpoint::read(&state.checkpoint_file(partition))
            .ok()
            .flatten()
            .is_some();
        let opened = self.open_and_verify(partition, existed && !clean);
        match opened {
            Ok(store) => Ok((
                store,
                match (existed, clean) {
                    (false, _) => StoreOpen::FullRestore,
                    (true, true) => StoreOpen::Clean,
                    (true, false) => StoreOpen::ReplayedTail,
                },
            )),
            Err(StoreError::Damaged { reason, .. }) => {
                let store = self.quarantine_and_recreate(partition, &reason)?;
                Ok((store, StoreOpen::Rebuilt))
            }
            Err(e) => Err(EngineError::Store(e.to_string())),
        }
    }

    fn open_and_verify(&self, partition: i32, verify: bool) -> Result<TaskStore, StoreError> {
        let state = &self.shared.state_dir;
        let store = TaskStore::open(
            &state.store_dir(partition),
            state.wal_dir(partition).as_deref(),
            &self.cfg.rocksdb,
            &self.memory,
            self.cfg.retention,
        )?;
        if verify {
            // After an unclean stop, read everything once: damaged SST blocks are found now,
            // not in the middle of processing.
            let keys = store.verify()?;
            info!(partition, keys, "store verified after an unclean shutdown");
        }
        Ok(store)
    }

    fn quarantine_and_recreate(
        &mut self,
        partition: i32,
        reason: &str,
    ) -> Result<TaskStore, EngineError> {
        error!(
            partition,
            reason, "state store damaged: quarantining it and rebuilding from the changelog"
        );
        let q = crate::quarantine::quarantine(&self.shared.state_dir, partition, reason, now_ms())
            .map_err(|e| {
                EngineError::Store(format!(
                    "quarantining the store of partition {partition}: {e}"
                ))
            })?;
        self.metrics.quarantines.inc();
        let list = self.quarantines.entry(partition).or_default();
        list.push(q);
        if list.len() > crate::quarantine::KEEP {
            list.remove(0);
        }
        self.open_and_verify(partition, false)
            .map_err(|e| EngineError::Store(e.to_string()))
    }

    fn add_restoring_task(&mut self, partition: i32, store: TaskStore, opened: StoreOpen) {
        let health = TaskHealth {
            partition,
            store_changelog_offset: store.meta().changelog_offset,
            opened: Some(opened),
            ..Default::default()
        };
        self.tasks.insert(
            partition,
            Task {
                partition,
                store,
                phase: TaskPhase::Restoring {
                    started: Instant::now(),
                },
                staged: Default::default(),
                position: None,
                committed: None,
                dirty: false,
                at_commit_marker: false,
                health,
            },
        );
        self.metrics.assigned_tasks.set(self.tasks.len() as i64);
        self.shared.set_ready(false);
    }

    /// Sets the consumer's local assignment to the active tasks, each at its position.
    fn reassign(&mut self, consumer: &GroupConsumer) {
        let mut tpl = TopicPartitionList::new();
        for task in self
            .tasks
            .values()
            .filter(|t| matches!(t.phase, TaskPhase::Active))
        {
            let offset = task.position.map_or(Offset::Beginning, Offset::Offset);
            tpl.add_partition_offset(&self.cfg.input_topic, task.partition, offset)
                .expect("valid partition");
        }
        if let Err(e) = consumer.assign(&tpl) {
            self.pending_error = Some(EngineError::Fatal(format!("assigning partitions: {e}")));
        }
    }

    // ---- the loop's work between polls ---------------------------------------------------

    /// Restores, activates, commits when due and publishes health. Call after every poll.
    pub fn tick(&mut self, consumer: &GroupConsumer) -> Result<(), EngineError> {
        if let Some(e) = self.pending_error.take() {
            return Err(e);
        }
        self.producer.poll(Duration::ZERO);
        self.restore_step()?;
        if self
            .tasks
            .values()
            .any(|t| matches!(t.phase, TaskPhase::Restored))
        {
            self.activate_restored(consumer)?;
        }
        if self
            .txn_started
            .is_some_and(|t| t.elapsed() >= self.cfg.commit_interval)
        {
            self.commit(consumer)?;
        }
        // Task statistics list the store's directory: refresh them on a timer, not per record.
        if self.last_publish.elapsed() >= PUBLISH_INTERVAL {
            self.publish_tasks(false);
        }
        match self.pending_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn restore_step(&mut self) -> Result<(), EngineError> {
        let Some(p) = self
            .tasks
            .values()
            .find(|t| matches!(t.phase, TaskPhase::Restoring { .. }))
            .map(|t| t.partition)
        else {
            return Ok(());
        };
        self.shared.set_phase(ProcessorPhase::Restoring);
        let task = self.tasks.get_mut(&p).expect("task exists");
        if task.health.restore.is_none() {
            let to_restore = self.restorer.begin(p, &task.store)?;
            info!(partition = p, from = ?task.store.meta().changelog_offset, to_restore, "restoring store from the changelog");
            task.health.restore = Some(RestoreProgress {
                records_restored: 0,
                records_to_restore: to_restore,
                started_at_ms: now_ms(),
                finished_at_ms: None,
            });
            self.publish_tasks(true);
        }
        let task = self.tasks.get_mut(&p).expect("task exists");
        match self.restorer.step(p, &mut task.store, RESTORE_STEP) {
            Ok((n, step)) => {
                self.metrics.restore_records.inc_by(n);
                let progress = task.health.restore.as_mut().expect("set above");
                progress.records_restored += n;
                task.health.store_changelog_offset = task.store.meta().changelog_offset;
                if step == Step::Done {
                    let TaskPhase::Restoring { started } = task.phase else {
                        unreachable!()
                    };
                    self.metrics
                        .restore_seconds
                        .inc_by(started.elapsed().as_secs_f64());
                    progress.finished_at_ms = Some(now_ms());
                    info!(
                        partition = p,
                        restored = progress.records_restored,
                        seconds = started.elapsed().as_secs_f64(),
                        changelog_offset = ?task.store.meta().changelog_offset,
                        "store restored"
                    );
                    task.phase = TaskPhase::Restored;
                    self.restorer.finish();
                }
                // Restore progress is what the agent reports during a restore: publish it with
                // every step (a step is up to RESTORE_STEP records), not only on the timer.
                self.publish_tasks(step == Step::Done);
                Ok(())
            }
            Err(crate::restore::RestoreError::Store(StoreError::Damaged { reason, .. })) => {
                self.restorer.finish();
                let store = self.quarantine_and_recreate(p, &reason)?;
                self.add_restoring_task(p, store, StoreOpen::Rebuilt);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Adds restored tasks to the consumer's assignment at their committed offsets. The open
    /// transaction is committed first so every position is a committed one.
    fn activate_restored(&mut self, consumer: &GroupConsumer) -> Result<(), EngineError> {
        self.commit(consumer)?;
        let restored: Vec<i32> = self
            .tasks
            .values()
            .filter(|t| matches!(t.phase, TaskPhase::Restored))
            .map(|t| t.partition)
            .collect();
        let mut tpl = TopicPartitionList::new();
        for &p in &restored {
            tpl.add_partition(&self.cfg.input_topic, p);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(30))
            .map_err(|e| EngineError::Fatal(format!("fetching committed offsets: {e}")))?;
        for &p in &restored {
            let offset = committed
                .find_partition(&self.cfg.input_topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            let task = self.tasks.get_mut(&p).expect("task exists");
            task.position = offset;
            task.committed = offset;
            task.health.committed_offset = offset;
            task.phase = TaskPhase::Active;
            // Invariant 3: the checkpoint vouches for a stopped store only.
            if let Err(e) = checkpoint::remove(&self.shared.state_dir.checkpoint_file(p)) {
                return Err(EngineError::Store(format!(
                    "removing the checkpoint of partition {p}: {e}"
                )));
            }
            info!(partition = p, offset = ?offset, "task active");
        }
        self.reassign(consumer);
        if self
            .tasks
            .values()
            .all(|t| matches!(t.phase, TaskPhase::Active))
        {
            self.shared.set_ready(true);
            self.shared.set_phase(ProcessorPhase::Running);
        }
        self.publish_tasks(true);
        Ok(())
    }

    // ---- processing ----------------------------------------------------------------------

    /// Processes one input record inside the open transaction.
    pub fn process(
        &mut self,
        consumer: &GroupConsumer,
        m: &BorrowedMessage<'_>,
    ) -> Result<(), EngineError> {
        let p = m.partition();
        let Some(task) = self.tasks.get_mut(&p) else {
            return Ok(());
        };
        if !matches!(task.phase, TaskPhase::Active)
            || task.position.is_some_and(|pos| m.offset() < pos)
        {
            // Fetched before a rewind or reassignment: it will come again in order.
            return Ok(());
        }
        if self.txn_started.is_none() {
            match self.producer.begin_transaction() {
                Ok(()) => self.txn_started = Some(Instant::now()),
                Err(e) => return Err(self.classify_fatal("begin_transaction", e)),
            }
        }
        self.metrics.records_in.inc();
        let outcome = self.process_record(p, m);
        let task = self.tasks.get_mut(&p).expect("task exists");
        task.position = Some(m.offset() + 1);
        task.dirty = true;
        match outcome {
            Ok(()) => Ok(()),
            Err(RecordError::Retry(why)) => {
                self.abort(consumer, &why);
                Ok(())
            }
            Err(RecordError::Store(reason)) => {
                self.abort(consumer, "state store error");
                self.rebuild_task(consumer, p, &reason)
            }
        }
    }

    fn process_record(&mut self, p: i32, m: &BorrowedMessage<'_>) -> Result<(), RecordError> {
        let headers = m.headers();
        let header = |name: &str| -> Option<&[u8]> {
            headers.and_then(|h| h.iter().find(|x| x.key == name)?.value)
        };
        let view = RecordView {
            key: m.key(),
            value: m.payload(),
            header: &header,
        };
        let id = match topology::extract_id(&view, &self.cfg.dedup_id, self.cfg.max_value_bytes) {
            Ok(id) => id,
            Err(rejection) => return self.send_dead_letter(m, &rejection),
        };
        let time = m.timestamp().to_millis().unwrap_or_else(now_ms);
        let task = self.tasks.get_mut(&p).expect("task exists");
        let first_seen = match task.staged.puts.get(&id) {
            Some(t) => Some(*t),
            None => task
                .store
                .first_seen(&id)
                .map_err(|e| RecordError::Store(e.to_string()))?,
        };
        if topology::is_duplicate(first_seen, time, self.cfg.retention.as_millis() as i64) {
            self.metrics.duplicates.inc();
            if let Some(topic) = self.cfg.duplicates_topic.clone() {
                self.send(&topic, None, m.key(), m.payload(), with_id(headers, &id))?;
            }
            return Ok(());
        }
        task.staged.put(&id, time);
        let changelog = self.cfg.changelog_topic.clone();
        self.send(
            &changelog,
            Some(p),
            Some(&id),
            Some(&time.to_be_bytes()),
            OwnedHeaders::new(),
        )?;
        // The downstream `enrich` stage: the place where a failure after the put would leave
        // an aborted write in a store that applied writes eagerly.
        if self.faults.after_put(header(FAULT_HEADER)).is_err() {
            return Err(RecordError::Retry(
                "injected failure in the enrich stage".into(),
            ));
        }
        let output = self.cfg.output_topic.clone();
        self.send(&output, None, m.key(), m.payload(), with_id(headers, &id))?;
        self.metrics.records_out.inc();
        Ok(())
    }

    fn send_dead_letter(
        &mut self,
        m: &BorrowedMessage<'_>,
        why: &Rejection,
    ) -> Result<(), RecordError> {
        warn!(partition = m.partition(), offset = m.offset(), reason = why.code(), detail = %why.detail(), "record to the dead-letter topic");
        let mut headers = copy_headers(m.headers())
            .insert(Header {
                key: topology::DLQ_REASON_HEADER,
                value: Some(why.code()),
            })
            .insert(Header {
                key: topology::DLQ_SOURCE_HEADER,
                value: Some(&format!("{}/{}/{}", m.topic(), m.partition(), m.offset())),
            });
        let mut value = m.payload();
        if let Rejection::ValueTooLarge { size, max } = why {
            // Keep the dead letter within the size that is known to fit; the original stays in
            // the input topic at the offset in the source header.
            value = value.map(|v| &v[..(*max as usize).min(v.len())]);
            headers = headers.insert(Header {
                key: topology::DLQ_ORIGINAL_SIZE_HEADER,
                value: Some(&size.to_string()),
            });
        }
        let topic = self.cfg.dead_letter_topic.clone();
        self.send(&topic, None, m.key(), value, headers)?;
        self.metrics
            .dead_letters
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: why.code().into(),
            })
            .inc();
        Ok(())
    }

    fn send(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: OwnedHeaders,
    ) -> Result<(), RecordError> {
        let mut record: BaseRecord<'_, [u8], [u8], ()> = BaseRecord::to(topic).headers(headers);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => {
                    return Err(RecordError::Retry(format!("producing to {topic}: {e}")));
                }
            }
        }
    }

    /// A store failed while processing: quarantine it and restore it again; the task rejoins
    /// the assignment once rebuilt.
    fn rebuild_task(
        &mut self,
        consumer: &GroupConsumer,
        p: i32,
        reason: &str,
    ) -> Result<(), EngineError> {
        self.tasks.remove(&p);
        let store = self.quarantine_and_recreate(p, reason)?;
        self.add_restoring_task(p, store, StoreOpen::Rebuilt);
        self.reassign(consumer);
        Ok(())
    }

    // ---- transactions --------------------------------------------------------------------

    /// Commits the open transaction and applies its writes to the stores. An abortable error
    /// aborts instead (writes dropped, consumer rewound); only fatal errors are returned.
    pub fn commit(&mut self, consumer: &GroupConsumer) -> Result<(), EngineError> {
        let Some(started) = self.txn_started else {
            return Ok(());
        };
        let commit_start = Instant::now();
        let failure = self.producer.context().failure.lock().unwrap().clone();
        if let Some(failure) = failure {
            self.abort(consumer, &failure);
            return Ok(());
        }
        let mut positions = TopicPartitionList::new();
        for task in self.tasks.values().filter(|t| t.dirty) {
            if let Some(pos) = task.position {
                positions
                    .add_partition_offset(
                        &self.cfg.input_topic,
                        task.partition,
                        Offset::Offset(pos),
                    )
                    .expect("valid");
            }
        }
        let Some(group) = consumer.group_metadata() else {
            self.abort(consumer, "no consumer group metadata");
            return Ok(());
        };
        await_deliveries(&self.producer, TXN_CALL_TIMEOUT);
        let sent = retry_txn(&self.cfg, || {
            self.producer
                .send_offsets_to_transaction(&positions, &group, TXN_CALL_TIMEOUT)
        });
        let committed = sent.and_then(|()| {
            retry_txn(&self.cfg, || {
                self.producer.commit_transaction(TXN_CALL_TIMEOUT)
            })
        });
        match committed {
            Ok(()) => {}
            Err(TxnError::Abortable(why)) => {
                self.abort(consumer, &why);
                return Ok(());
            }
            Err(TxnError::Fenced(d)) => {
                return Err(EngineError::Fenced {
                    transactional_id: self.cfg.transactional_id(),
                    detail: d,
                });
            }
            Err(TxnError::Fatal(d)) => return Err(EngineError::Fatal(format!("commit: {d}"))),
        }
        self.txn_started = None;
        self.metrics.transactions_committed.inc();
        // Committed: now, and only now, the staged writes reach the stores.
        let changelog_offsets = self.producer.context().take_offsets();
        let mut damaged = Vec::new();
        for task in self.tasks.values_mut().filter(|t| t.dirty) {
            task.staged.changelog_offset = changelog_offsets.get(&task.partition).map(|o| o + 1);
            if task.staged.changelog_offset.is_some() {
                task.at_commit_marker = true;
            }
            task.staged.input_offset = task.position;
            if let Err(e) = task.store.apply(&task.staged) {
                // The data is safe in the changelog: rebuild the store from it.
                damaged.push((task.partition, e.to_string()));
            }
            task.staged.clear();
            task.committed = task.position;
            task.dirty = false;
            task.health.committed_offset = task.committed;
            task.health.store_changelog_offset = task.store.meta().changelog_offset;
            task.health.last_checkpoint_at_ms = Some(now_ms());
        }
        for (p, reason) in damaged {
            self.rebuild_task(consumer, p, &reason)?;
        }
        self.metrics
            .commit_seconds
            .observe(commit_start.elapsed().as_secs_f64());
        debug!(
            txn_ms = started.elapsed().as_millis() as u64,
            "transaction committed"
        );
        Ok(())
    }

    /// Aborts the open transaction: staged writes are dropped and the consumer goes back to
    /// the committed positions, so the records are processed again.
    fn abort(&mut self, consumer: &GroupConsumer, why: &str) {
        if self.txn_started.take().is_none() {
            return;
        }
        warn!(reason = why, "aborting the transaction");
        self.metrics.transactions_aborted.inc();
        // librdkafka waits for the delivery reports of the aborted records, and a BaseProducer
        // only serves them when polled: flush serves them (the records are aborted anyway).
        let _ = self.producer.flush(TXN_CALL_TIMEOUT);
        if let Err(e) = retry_txn(&self.cfg, || {
            self.producer.poll(Duration::ZERO);
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        }) {
            self.pending_error = Some(match e {
                TxnError::Fenced(d) => EngineError::Fenced {
                    transactional_id: self.cfg.transactional_id(),
                    detail: d,
                },
                TxnError::Abortable(d) | TxnError::Fatal(d) => {
                    EngineError::Fatal(format!("abort: {d}"))
                }
            });
        }
        self.producer.context().clear();
        for task in self.tasks.values_mut() {
            task.staged.clear();
            if task.dirty {
                task.position = task.committed;
                task.dirty = false;
                if matches!(task.phase, TaskPhase::Active) {
                    let offset = task.committed.map_or(Offset::Beginning, Offset::Offset);
                    if let Err(e) = consumer.seek(
                        &self.cfg.input_topic,
                        task.partition,
                        offset,
                        Duration::from_secs(10),
                    ) {
                        warn!(partition = task.partition, error = %e, "seek after abort failed; reassigning");
                    }
                }
            }
        }
        // Reassigning with the committed positions rewinds even where a seek failed.
        self.reassign(consumer);
    }

    fn classify_fatal(&self, what: &str, e: KafkaError) -> EngineError {
        match classify(&e) {
            TxnError::Fenced(d) => EngineError::Fenced {
                transactional_id: self.cfg.transactional_id(),
                detail: d,
            },
            TxnError::Abortable(d) | TxnError::Fatal(d) => {
                EngineError::Fatal(format!("{what}: {d}"))
            }
        }
    }

    // ---- drain and health ----------------------------------------------------------------

    /// Finishes the open transaction, flushes every store, writes the checkpoints and stops
    /// processing. The process exits afterwards.
    pub fn drain(&mut self, consumer: &GroupConsumer) -> DrainOutcome {
        let start = Instant::now();
        self.shared.set_phase(ProcessorPhase::Draining);
        self.shared.set_ready(false);
        if let Err(e) = self.commit(consumer) {
            return DrainOutcome::Failed(e.to_string());
        }
        for task in self
            .tasks
            .values()
            .filter(|t| matches!(t.phase, TaskPhase::Active))
        {
            if let Err(e) = self.close_cleanly(task) {
                return DrainOutcome::Failed(e);
            }
        }
        self.drained = true;
        let duration_ms = start.elapsed().as_millis() as u64;
        self.publish_tasks(true);
        self.shared.update(true, |h| {
            h.phase = ProcessorPhase::Drained;
            h.drain_duration_ms = Some(duration_ms);
        });
        info!(duration_ms, "drained: stores flushed, checkpoints written");
        DrainOutcome::Drained { duration_ms }
    }

    /// Flush + checkpoint of a task whose writes are all applied.
    fn close_cleanly(&self, task: &Task) -> Result<(), String> {
        task.store.flush().map_err(|e| e.to_string())?;
        let mut entries = Vec::new();
        if let Some(o) = task.store.meta().changelog_offset {
            entries.push(CheckpointEntry {
                topic: self.cfg.changelog_topic.clone(),
                partition: task.partition,
                offset: o,
            });
        }
        if let Some(o) = task.committed {
            entries.push(CheckpointEntry {
                topic: self.cfg.input_topic.clone(),
                partition: task.partition,
                offset: o,
            });
        }
        checkpoint::write(
            &self.shared.state_dir.checkpoint_file(task.partition),
            &entries,
        )
        .map_err(|e| {
            format!(
                "writing the checkpoint of partition {}: {e}",
                task.partition
            )
        })
    }

    /// Refreshes the tasks in the health report (store sizes, WAL files, changelog end).
    fn publish_tasks(&mut self, force: bool) {
        self.last_publish = Instant::now();
        let mut reports = Vec::new();
        for task in self.tasks.values_mut() {
            let label = Metrics::partition(task.partition);
            task.health.store_keys = task.store.estimated_keys();
            task.health.store_bytes = task.store.sst_bytes();
            task.health.wal = crate::state_dir::wal_files(task.store.wal_dir());
            self.metrics
                .store_keys
                .get_or_create(&label)
                .set(task.health.store_keys as i64);
            self.metrics
                .store_bytes
                .get_or_create(&label)
                .set(task.health.store_bytes as i64);
            self.metrics
                .wal_bytes
                .get_or_create(&label)
                .set(task.health.wal.bytes as i64);
            task.health.quarantines = self
                .quarantines
                .get(&task.partition)
                .cloned()
                .unwrap_or_default();
            reports.push(task.health.clone());
        }
        self.shared.update(force, |h| h.tasks = reports);
    }

    /// Looks up the changelog end of every task for the health report (a broker round trip
    /// per task: done on a slow timer by the loop).
    pub fn refresh_changelog_ends(&mut self) {
        for task in self.tasks.values_mut() {
            if let Ok(end) = self.restorer.end_offset(task.partition) {
                // Right after our own commit the log ends with its marker, which holds no
                // data: the store is caught up, not one record behind.
                let caught_up =
                    task.at_commit_marker && task.store.meta().changelog_offset == Some(end - 1);
                task.health.changelog_end_offset = Some(if caught_up { end - 1 } else { end });
            }
        }
    }

    pub fn is_drained(&self) -> bool {
        self.drained
    }

    /// Stops the engine: later rebalance callbacks (the consumer's close) only let go of the
    /// partitions, without committing or writing checkpoints.
    pub fn stop(&mut self) {
        self.drained = true;
    }
}

/// Why processing one record did not work out.
enum RecordError {
    /// Abort the transaction and process again (produce failure, injected failure).
    Retry(String),
    /// The task's store failed: rebuild it.
    Store(String),
}

fn copy_headers(headers: Option<&rdkafka::message::BorrowedHeaders>) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    if let Some(h) = headers {
        for header in h.iter() {
            out = out.insert(header);
        }
    }
    out
}

fn with_id(headers: Option<&rdkafka::message::BorrowedHeaders>, id: &[u8]) -> OwnedHeaders {
    copy_headers(headers).insert(Header {
        key: topology::DEDUP_ID_HEADER,
        value: Some(id),
    })
}

/// The three ways a transactional call can fail, as librdkafka classifies them.
enum TxnError {
    /// Abort the transaction and carry on.
    Abortable(String),
    /// Another instance took over this transactional.id.
    Fenced(String),
    /// The producer cannot be used any more.
    Fatal(String),
}

fn classify(e: &KafkaError) -> TxnError {
    let code = e.rdkafka_error_code();
    if matches!(
        code,
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::FencedInstanceId
        )
    ) {
        return TxnError::Fenced(e.to_string());
    }
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => {
            if matches!(
                t.code(),
                RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced
            ) {
                TxnError::Fenced(t.to_string())
            } else {
                TxnError::Fatal(t.to_string())
            }
        }
        KafkaError::Transaction(t) if t.txn_requires_abort() => TxnError::Abortable(t.to_string()),
        _ => TxnError::Abortable(e.to_string()),
    }
}

/// Serves delivery reports until no record is in flight, or `timeout` passes.
///
/// rust-rdkafka's `commit_transaction` flushes first, and its flush polls in slices of 100 ms
/// that run to their end even when the last delivery report arrives a millisecond in: every
/// commit took at least 100 ms, which was most of the end-to-end latency. Waiting here in 1 ms
/// slices first leaves that flush nothing to wait for.
pub fn await_deliveries<C: ProducerContext>(producer: &BaseProducer<C>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        producer.poll(Duration::from_millis(1));
    }
}

/// Calls a transactional function until it succeeds or fails for a reason other than a
/// retriable one (timeouts included: the operation continues in the background and calling
/// again is how to wait for it).
fn retry_txn(
    cfg: &EngineConfig,
    mut f: impl FnMut() -> Result<(), KafkaError>,
) -> Result<(), TxnError> {
    let deadline = Instant::now() + TXN_DEADLINE;
    loop {
        match f() {
            Ok(()) => return Ok(()),
            Err(e) => {
                let retriable = match &e {
                    KafkaError::Transaction(t) => t.is_retriable(),
                    // rust-rdkafka flushes before committing; a flush timeout means "not yet".
                    KafkaError::Flush(_) => true,
                    _ => false,
                };
                if retriable && Instant::now() < deadline {
                    debug!(error = %e, id = %cfg.transactional_id(), "retriable transactional error; retrying");
                    continue;
                }
                return Err(classify(&e));
            }
        }
    }
}
