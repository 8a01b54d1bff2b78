//! The exactly-once processing loop: the driver of the task lifecycle
//! ([`crate::lifecycle`]), talking to Kafka and RocksDB.
//!
//! One consumer (group = application id, static membership = pod name, read_committed) and one
//! transactional producer (transactional.id = `<application id>-<pod name>`) per engine, and
//! one engine per processing thread: with `processingThreads` above 1 the threads after the
//! first are members `<pod name>-thread-<n>` of their own ([`EngineConfig::member_id`]), each
//! with its share of the tasks, like Kafka Streams' stream threads. Each
//! assigned input partition is a task with its own store. A transaction spans all tasks and
//! carries output, duplicates, dead letters, changelog records and the consumer offsets; it is
//! committed every commit interval. Only after the commit succeeded are the staged writes
//! applied to the stores (with their changelog offsets, atomically). An abort drops them and
//! rewinds the consumer to the committed positions.
//!
//! Partitions are added to the consumer's local assignment only once their store is restored:
//! the group's assignment callback only records the lifecycle events, the loop has stores
//! opened, restored step by step and then assigns them with their committed offsets, so no
//! record is ever processed against a store that is not caught up. Opening, reopening and
//! closing stores happen on the state updater's threads, never inside a rebalance callback nor
//! on the processing thread while a transaction is open (a slow disk would keep it open past
//! `transaction.timeout.ms`).
//!
//! With repartitioning ([`crate::repartition`]) the consumer reads two topics: the input, whose
//! partitions are tasks of the stateless route stage ([`RouteStage`]: an id and a send, no
//! store), and the repartition topic, whose partitions are the dedup tasks above. One
//! transaction carries both stages' offsets and records.
//!
//! The engine holds four roles and drives them: the transaction ([`transaction`]), the dedup
//! stage ([`dedup`]), the route stage ([`RouteStage`]) and the health and metrics reports
//! ([`reporting`]). A commit reads as: ask the stages for their offsets, commit, tell them
//! ([`commit`]). A record's way from poll to commit: [`consumed`] (what it is), [`processing`]
//! or [`routing`] (what it becomes, sent in the transaction), [`commit`].
//!
//! The work is split by concern:
//! - [`membership`]: the rebalance callbacks, and the revoke and assignment steps both
//!   memberships feed;
//! - [`state_aware_group`]: the processor's own membership with standbys (ADR 0001), used
//!   when `group.standbyReplicas` is 1 or more;
//! - [`tasks`]: carrying out the lifecycle's commands (open, restore and close through the
//!   [`crate::state_updater`] threads, activate, back off, quarantine, checkpoints);
//! - [`dedup`]: the dedup stage's tasks, their offsets to commit, what a commit or an abort
//!   does to them;
//! - [`processing`]: one record of the dedup stage inside the open transaction, dead letters;
//! - [`routing`]: one record of the route stage (repartitioning only);
//! - [`transaction`]: the producer and the open transaction: begin, send, commit, abort;
//! - [`commit`]: ending a transaction, and what its failures lead to;
//! - [`delivery`]: the producer's delivery reports;
//! - [`verification`]: background checksum scans of the stores and what they find.

mod commit;
mod consumed;
mod dedup;
mod delivery;
mod membership;
mod processing;
mod reporting;
mod routing;
mod send_now;
mod state_aware_group;
mod tasks;
mod transaction;
mod verification;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use streamapp_api::config::{
    DEFAULT_TRANSACTION_TIMEOUT, GroupTiming, ResolvedConfig, ResolvedRocksDb, ResolvedTopology,
};
use streamapp_api::health::{ProcessorPhase, Quarantine};
use tracing::info;

use crate::faults::Faults;
use crate::lifecycle::{Event, Phase};
use crate::log_ends::{self, LogEndsReader};
use crate::metrics::Metrics;
use crate::repartition::{Purger, RouteStage};
use crate::shared::{DrainOutcome, Shared, now_ms};
use crate::state_updater::{StateUpdater, StoreOpener};
use crate::store::{SharedMemory, Verifier, Window};
use dedup::{DedupStage, Task};
use reporting::ThreadGauges;
use transaction::Transaction;

pub use delivery::{DeliveryTracker, Origin, await_deliveries};
pub use membership::{GroupConsumer, GroupContext, bound_consumer_buffer};
pub use transaction::commit_due;

/// Timeout of each transactional call; retriable errors are retried until [`TXN_DEADLINE`].
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(10);
const TXN_DEADLINE: Duration = Duration::from_secs(120);
/// How long a drain waits for the stores the state updater opens or closes.
const DRAIN_SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How often task statistics (store size, WAL files) are refreshed for the health report.
const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// Sets `key` unless the user's client properties already do (tuning, not correctness: the
/// properties the processor must own are refused by the configuration).
fn default_property(cfg: &mut ClientConfig, key: &str, value: &str) {
    if cfg.get(key).is_none() {
        cfg.set(key, value);
    }
}

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
    /// A topic the processor writes cannot be written at all (gone, or not authorised): the
    /// configuration or the cluster must change, restarting does not help.
    #[error("topic {topic} cannot be written: {detail}")]
    TopicUnusable { topic: String, detail: String },
    /// A thread of the state updater panicked: the stores it held are closed, and the engine
    /// starts over (opening and restoring them again).
    #[error(
        "the state updater's thread {thread} panicked (see the panic above); the stores it held are closed"
    )]
    UpdaterPanicked { thread: &'static str },
    #[error(transparent)]
    Restore(#[from] crate::restore::RestoreError),
}

/// What the engine needs to know: the resolved configuration's part it runs, and what start-up
/// found ([`EngineConfig::new`]).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub application_id: String,
    pub pod: String,
    /// Which of the process's processing threads runs this engine (0 with one thread).
    pub thread: usize,
    /// Topics, the dedup id, the window and the record limits.
    pub topology: ResolvedTopology,
    pub changelog_topic: String,
    /// The changelog topic's id (KIP-516) when the engine started, if the broker tells it:
    /// stores of an earlier topic of the same name are rebuilt, not mixed with this one.
    pub changelog_topic_id: Option<[u8; 16]>,
    /// The internal topic of the route stage, when the topology repartitions: the dedup
    /// tasks read it instead of the input.
    pub repartition_topic: Option<String>,
    /// Partitions of the input topic, as found at start-up.
    pub input_partitions: u32,
    pub rocksdb: ResolvedRocksDb,
    /// Client properties shared by consumer and producer (bootstrap, security, user extras).
    pub client: ClientConfig,
    /// How the processes share the tasks.
    pub group: GroupSetup,
}

/// Standbys and the state-aware membership (see [`streamapp_api::config::GroupSettings`]).
#[derive(Clone, Debug)]
pub struct GroupSetup {
    /// 0: librdkafka's membership, no standbys; more: the processor's own membership.
    pub standby_replicas: u32,
    pub acceptable_recovery_lag: u64,
    pub timing: GroupTiming,
    /// The Kubernetes node this pod runs on (standbys go to other nodes first).
    pub node: Option<String>,
}

impl EngineConfig {
    /// The first processing thread's engine of pod `pod`, from the resolved configuration and
    /// what start-up found: the input's partitions, the Kafka client properties (with the
    /// credentials and the batch size) and the Kubernetes node the pod runs on.
    pub fn new(
        config: &ResolvedConfig,
        pod: &str,
        input_partitions: u32,
        client: ClientConfig,
        node: Option<String>,
    ) -> Self {
        EngineConfig {
            application_id: config.application_id.clone(),
            pod: pod.to_string(),
            thread: 0,
            topology: config.topology.clone(),
            changelog_topic: config.changelog_topic.clone(),
            // Read at each engine start (workers.rs).
            changelog_topic_id: None,
            repartition_topic: config.repartition_topic.clone(),
            input_partitions,
            rocksdb: config.rocksdb.clone(),
            client,
            group: GroupSetup {
                standby_replicas: config.group.standby_replicas,
                acceptable_recovery_lag: config.group.acceptable_recovery_lag,
                timing: config.group.timing,
                node,
            },
        }
    }

    /// The topic the dedup tasks read: the repartition topic when the topology repartitions,
    /// else the input.
    pub fn dedup_input(&self) -> &str {
        self.repartition_topic
            .as_deref()
            .unwrap_or(&self.topology.input_topic)
    }

    /// This engine's group member: the pod, or the pod's processing thread.
    pub fn member_id(&self) -> String {
        streamapp_api::config::group_member(&self.pod, self.thread)
    }

    pub fn transactional_id(&self) -> String {
        streamapp_api::config::transactional_id(&self.application_id, &self.member_id())
    }

    /// The producer's `transaction.timeout.ms`: the coordinator aborts transactions open
    /// longer than this.
    pub fn transaction_timeout(&self) -> Duration {
        self.client
            .get("transaction.timeout.ms")
            .and_then(|v| v.parse().ok())
            .map_or(DEFAULT_TRANSACTION_TIMEOUT, Duration::from_millis)
    }
}

impl Drop for Engine {
    /// Closes the stores still open (dropping them, and those the state updater has), then
    /// lets the other processing threads have their directories.
    fn drop(&mut self) {
        self.dedup.tasks.clear();
        // The store thread finishes what it opens or closes first.
        self.updater.shutdown();
        self.shared.release_stores(self.cfg.thread);
    }
}

/// The stage a consumed record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The input record of a repartitioning topology: re-keyed by its id.
    Route,
    /// A record the dedup tasks process (the input, or the repartition topic).
    Dedup,
}

/// The processing state of one process. Lives behind a mutex shared with the consumer's
/// rebalance callback, which runs inside `poll` on the same thread.
pub struct Engine {
    cfg: EngineConfig,
    /// The producer and the open transaction.
    txn: Transaction,
    /// The dedup stage: its tasks, their stores, its records' failed attempts.
    dedup: DedupStage,
    /// The route stage (repartitioning only): its tasks by input partition.
    routes: RouteStage,
    /// Restores the stores of tasks that are not active yet, on a thread of its own.
    updater: StateUpdater,
    /// Partitions whose store the updater holds.
    in_updater: BTreeSet<i32>,
    /// Partitions whose store the updater's store thread opens, reopens or closes: their
    /// tasks wait, and their directories stay claimed until it is done.
    store_io: BTreeSet<i32>,
    /// Reads the ends of the changelog and the inputs on a thread of its own, for the health
    /// report, the stage lag and the tasks held at an open transaction.
    log_ends: LogEndsReader,
    /// Scans stores for damage in the background.
    verifier: Verifier,
    /// Deletes what the dedup stage committed from the repartition topic.
    purger: Option<Purger>,
    last_purge: Instant,
    memory: SharedMemory,
    shared: Arc<Shared>,
    metrics: Metrics,
    /// This engine's parts of the process's gauges.
    gauges: ThreadGauges,
    faults: Faults,
    /// An error raised inside a callback, returned by the next `tick`.
    pending_error: Option<EngineError>,
    /// Quarantines per partition during this process's life (newest last, bounded).
    quarantines: BTreeMap<i32, Vec<Quarantine>>,
    last_publish: Instant,
    /// The group's assignment arrived since the last revoke.
    assigned: bool,
    draining: bool,
    /// Drained or stopped: later rebalance callbacks only let go.
    stopped: bool,
    /// A task stopped consuming: the consumer's assignment must be set again.
    reassign_needed: bool,
    /// Consumption paused after transient produce failures, until then.
    paused_until: Option<Instant>,
    /// Consecutive aborts on transient produce failures (the pause doubles with each).
    transient_aborts: u32,
    /// The wall clock in ms as of the last tick (at most TICK_EVERY records, or one poll's
    /// wait, old): what the records are checked against for the maximum skew, and the time of
    /// their changelog records. Read per record, the clock cost more than the record's lookup.
    wall_ms: i64,
    /// The processor's own group membership, when standbys are configured; `None`: the
    /// consumer's (librdkafka's) membership.
    own_group: Option<state_aware_group::StateAwareGroup>,
}

impl Engine {
    /// Creates the transactional producer (fencing any older instance with the same identity)
    /// and the engine, and the group consumer wired to it.
    pub fn start(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        memory: SharedMemory,
        metrics: Metrics,
        faults: Faults,
    ) -> Result<(Arc<Mutex<Engine>>, GroupConsumer), EngineError> {
        let fatal = |what: &str, e: KafkaError| EngineError::Fatal(format!("{what}: {e}"));
        let txn = Transaction::start(&cfg, shared.clone(), metrics.clone())?;
        let opener = StoreOpener {
            state: shared.state_dir.clone(),
            rocksdb: cfg.rocksdb.clone(),
            memory: memory.clone(),
            window: Window {
                retention: cfg.topology.retention,
                max_skew: cfg.topology.max_skew,
            },
            changelog_topic: cfg.changelog_topic.clone(),
            changelog_topic_id: cfg.changelog_topic_id,
            open_stores: shared.open_stores.clone(),
        };
        let updater = StateUpdater::start(&cfg.client, &cfg.changelog_topic)
            .map_err(|e| fatal("creating the restore consumer", e))?
            .with_stores(opener);
        let log_ends = LogEndsReader::start(
            &cfg.client,
            log_ends::Topics {
                changelog: cfg.changelog_topic.clone(),
                dedup_input: cfg.dedup_input().to_string(),
                route_input: cfg
                    .repartition_topic
                    .as_ref()
                    .map(|_| cfg.topology.input_topic.clone()),
            },
        )
        .map_err(|e| fatal("creating the log-ends probes", e))?;
        let purger = match &cfg.repartition_topic {
            Some(topic) => Some(
                Purger::start(&cfg.client, topic)
                    .map_err(|e| fatal("creating the repartition purger", e))?,
            ),
            None => None,
        };
        metrics.input_partitions.set(cfg.input_partitions as i64);
        shared.update(true, |h| h.input_partitions = Some(cfg.input_partitions));
        // With standbys our own membership assigns the consumer its partitions (it never
        // subscribes); its generations wait in a channel until the loop takes them.
        let own_group = match cfg.group.standby_replicas {
            0 => None,
            _ => Some(state_aware_group::StateAwareGroup::start(
                &cfg,
                &shared.state_dir,
            )?),
        };
        let engine = Arc::new(Mutex::new(Engine {
            dedup: DedupStage::new(cfg.topology.max_record_attempts, &cfg.topology.input_topic),
            routes: RouteStage::new(cfg.topology.max_record_attempts),
            cfg: cfg.clone(),
            txn,
            updater,
            in_updater: BTreeSet::new(),
            store_io: BTreeSet::new(),
            log_ends,
            verifier: Verifier::start(cfg.rocksdb.verify_keys_per_second),
            purger,
            last_purge: Instant::now(),
            memory,
            shared,
            gauges: ThreadGauges::new(&metrics),
            metrics,
            faults,
            pending_error: None,
            quarantines: BTreeMap::new(),
            last_publish: Instant::now(),
            assigned: false,
            draining: false,
            stopped: false,
            reassign_needed: false,
            paused_until: None,
            transient_aborts: 0,
            wall_ms: now_ms(),
            own_group,
        }));
        let consumer = membership::new_consumer(&cfg, engine.clone())?;
        if cfg.group.standby_replicas == 0 {
            let mut topics = vec![cfg.topology.input_topic.as_str()];
            topics.extend(cfg.repartition_topic.as_deref());
            consumer
                .subscribe(&topics)
                .map_err(|e| fatal("subscribing", e))?;
        }
        Ok((engine, consumer))
    }

    /// Opens, restores, activates, commits when due and publishes health. Call after every
    /// poll.
    pub fn tick(&mut self, consumer: &GroupConsumer) -> Result<(), EngineError> {
        self.wall_ms = now_ms();
        self.shared.beat(self.cfg.thread);
        if let Some(e) = self.pending_error.take() {
            return Err(e);
        }
        self.take_group_events(consumer)?;
        self.txn.poll();
        self.end_backoffs();
        self.open_next();
        self.restore_step()?;
        if self.dedup.tasks.values().any(|t| t.is(&Phase::Restored))
            || !self.routes.waiting().is_empty()
        {
            self.activate_restored(consumer)?;
        }
        if self.txn.commit_due(self.cfg.topology.commit_interval) {
            self.commit(consumer)?;
        }
        if self.paused_until.is_some_and(|t| Instant::now() >= t) {
            // The pause ends: the active partitions are assigned again, resumed.
            self.paused_until = None;
            self.reassign(consumer);
        }
        if std::mem::take(&mut self.reassign_needed) {
            self.reassign(consumer);
        }
        self.purge_repartitioned();
        self.take_verifications(consumer);
        // Task statistics list the store's directory: refresh them on a timer, not per record.
        if self.last_publish.elapsed() >= PUBLISH_INTERVAL {
            self.start_due_verifications();
            self.publish_tasks(false);
        }
        match self.pending_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every purge interval: hands the dedup stage's committed offsets on the repartition
    /// topic to the purger, which asks the broker for those it has not confirmed yet (what is
    /// before them is processed and committed for good).
    fn purge_repartitioned(&mut self) {
        let Some(purger) = &self.purger else { return };
        if self.last_purge.elapsed() < crate::repartition::PURGE_INTERVAL {
            return;
        }
        self.last_purge = Instant::now();
        purger.purge(&self.dedup.committed_offsets());
    }

    // ---- drain and health ----------------------------------------------------------------

    /// Finishes the open transaction, closes every store cleanly (flush, close, checkpoint)
    /// and stops processing. The process exits afterwards.
    pub fn drain(&mut self, consumer: &GroupConsumer) -> DrainOutcome {
        let start = Instant::now();
        self.draining = true;
        self.shared.set_phase(ProcessorPhase::Draining);
        self.refresh_readiness();
        if let Err(e) = self.commit(consumer) {
            return DrainOutcome::Failed(e.to_string());
        }
        // Stores being opened or closed by the state updater come back first, to be closed
        // with the others (with their checkpoints).
        self.settle_store_io(DRAIN_SETTLE_TIMEOUT);
        // The report keeps the tasks' final offsets; closing takes them out of the engine.
        self.publish_tasks(true);
        self.routes.stop();
        let mut failures = Vec::new();
        let partitions: Vec<i32> = self.dedup.tasks.keys().copied().collect();
        for p in partitions {
            if let Some(e) = self.on_task_event(p, Event::Drain) {
                failures.push(format!("closing the store of partition {p}: {e}"));
            }
        }
        self.stopped = true;
        if !failures.is_empty() {
            return DrainOutcome::Failed(failures.join("; "));
        }
        // The process is drained when every processing thread is (see crate::workers).
        let duration_ms = start.elapsed().as_millis() as u64;
        info!(
            duration_ms,
            "drained: stores flushed and closed, checkpoints written"
        );
        DrainOutcome::Drained { duration_ms }
    }

    pub fn is_drained(&self) -> bool {
        self.stopped
    }

    /// Stops the engine: later rebalance callbacks (the consumer's close) only let go of the
    /// partitions, without committing or writing checkpoints.
    pub fn stop(&mut self) {
        self.stopped = true;
    }
}
