//! Replaying a changelog partition into a task's store, from the store's own offset to the end.
//!
//! A store whose offset is past the end of the changelog cannot be a prefix of it (the
//! changelog was deleted and recreated, or lost data): restore refuses to mix the two
//! ([`RestoreError::AheadOfChangelog`]), and the task rebuilds the store from the log as it is.
//!
//! The changelog is read with read_committed, so aborted writes never reach the store. One
//! reader restores every partition that needs it at once (each added to its assignment as its
//! store is ready, removed once caught up; its records taken from librdkafka a batch at a time,
//! `record_batches.rs`), in steps of a bounded number of records so the
//! processing thread keeps serving the group consumer and committing the active tasks
//! meanwhile. A partition is finished only when the visible end of it is its real end: while
//! another producer (a previous owner of the task) still has a transaction open on it, records
//! after it may yet become visible, so that partition waits for it to end — without holding
//! the other partitions back.
//!
//! A store that holds nothing when its restore begins (a lost disk, a pod on a new node) is
//! **loaded in bulk** when its memtable budget has room: its records are gathered into runs as
//! large as a memtable, kept from one step to the next, and each full run (and the last one, at
//! the partition's end) is written as a sorted file and ingested (`store/ingest.rs`), past the
//! memtable, the WAL and the flush (`pending.rs` holds either kind of partition's records).
//!
//! A **follower** ([`Restorer::follower`]) reads the same way for standby stores, but never
//! finishes: at the visible end it applies what it read with the reader's position (both in one
//! batch, so the store's offset never vouches for more than it holds) and goes on reading what
//! gets committed. The active's open transaction is the normal state of a followed partition,
//! not something to wait for: read_committed stops before it and hands its records over only
//! once it commits, and never those of an aborted one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};

use crate::kafka_errors::reader_error_is_transient;
use crate::open_transactions::HighWatermarks;
use crate::store::{BulkLoad, Run, StoreError, TaskStore};

mod changelog_record;
mod pending;
mod record_batches;
pub use changelog_record::ChangelogRecord;
use pending::Pending;
use record_batches::{Batch, Fetched, RecordQueue};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("reading changelog {topic} partition {partition}: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        source: KafkaError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "the store has applied changelog {topic} partition {partition} up to offset {offset}, but the \
         partition ends at {end}: the changelog was recreated or lost data, so the store is not a prefix of it"
    )]
    AheadOfChangelog {
        topic: String,
        partition: i32,
        offset: i64,
        end: i64,
    },
}

impl RestoreError {
    /// Kafka was away (a broker restarting, a leader moving): the reader waits it out.
    pub fn is_transient(&self) -> bool {
        matches!(self, RestoreError::Kafka { source, .. } if reader_error_is_transient(source))
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// More to read.
    InProgress,
    /// At the visible end, but a transaction of another producer is still open on the
    /// partition: wait for it to commit or abort.
    WaitingForOpenTransaction,
    /// Caught up with the changelog.
    Done,
    /// A follower at the visible end: it goes on reading what gets committed.
    Following,
    /// Kafka did not answer (a broker restarting): the partition is read again shortly.
    WaitingForKafka,
}

/// The reader's client context: reaching the end of a partition is how restore finishes, not
/// an error worth an ERROR line (librdkafka reports it as one).
struct ReaderContext;

impl ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let end_of_partition = matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        );
        if !end_of_partition {
            error!("librdkafka (restore): {error}: {reason}");
        }
    }
}

impl ConsumerContext for ReaderContext {}

/// How often a partition whose visible end is not its real end (an open transaction of
/// another producer) is read again.
const WAIT_RECHECK: Duration = Duration::from_millis(200);
/// How long one step reads at most (the state updater serves requests between steps).
const STEP_TIME: Duration = Duration::from_millis(100);
/// Records taken from librdkafka at once (`record_batches.rs`); the step's time and whether a
/// partition still reads are looked at between batches.
const READ_BATCH: usize = 1024;
/// How often a partition is tried again while Kafka does not answer.
const KAFKA_RECHECK: Duration = Duration::from_secs(1);
/// At most one warning this often about Kafka being away.
const KAFKA_WARN_EVERY: Duration = Duration::from_secs(10);

/// Where the restore of one partition stands.
#[derive(Debug, Default)]
struct Partition {
    /// Waiting for an open transaction to end: since when, and when to read again (the
    /// partition is out of the reader's assignment until then).
    waiting_since: Option<Instant>,
    recheck_at: Option<Instant>,
    warned_at: Option<Instant>,
    /// Kafka did not answer when the restore began: the store's offset is not checked against
    /// the changelog yet, and the partition is not read until it is (at `recheck_at`).
    unchecked: bool,
}

/// Reads changelog partitions for restore, all of them through one reader.
pub struct Restorer {
    topic: String,
    /// Standby stores: never finished, see the module's doc.
    follow: bool,
    /// Where the restored partitions' fetched records go (`record_batches.rs`). Before the
    /// reader: dropped first.
    records: RecordQueue,
    /// read_committed, partition EOF events on.
    reader: BaseConsumer<ReaderContext>,
    ends: HighWatermarks,
    partitions: BTreeMap<i32, Partition>,
    /// Undecodable records skipped, by partition, until [`Restorer::take_skipped`].
    skipped: BTreeMap<i32, Skipped>,
    /// When the reader last warned that Kafka is away.
    kafka_warned_at: Option<Instant>,
    /// The source topic of the last sighting read: nearly all name the input topic, which is
    /// then shared instead of allocated per record.
    last_topic: Option<Arc<str>>,
    /// The partitions whose store was empty when their restore began: restored in runs
    /// ingested as files (`store/ingest.rs`), each with the run it is filling.
    bulk: BTreeMap<i32, (BulkLoad, Run)>,
}

/// What one step did for one partition.
pub type PartitionStep = Result<(u64, Step), RestoreError>;

impl Restorer {
    /// A reader that catches stores up with the changelog and then hands them back.
    pub fn new(base: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        Self::with_mode(base, topic, false)
    }

    /// A reader that keeps standby stores caught up for as long as it holds them. Its own
    /// reader, so a restore that a task waits for never queues behind standbys.
    pub fn follower(base: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        Self::with_mode(base, topic, true)
    }

    fn with_mode(base: &ClientConfig, topic: &str, follow: bool) -> Result<Self, KafkaError> {
        let mut reader_cfg = base.clone();
        reader_cfg
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            // A restore starts at the store's offset, checked against the log's start and end
            // first. A follower's position can only fall out of the log when the changelog was
            // recreated under it (or it fell a whole retention behind): it must not start over
            // silently in a log it never saw, so that is an error, which restarts the engine
            // and with it the checks of `begin` and the store's changelog identity.
            .set(
                "auto.offset.reset",
                if follow { "error" } else { "earliest" },
            )
            // A catch-up reader: at the end of the partition the broker answers at once
            // instead of holding the fetch for new records (500 ms by default), which would
            // add up to a second per partition to every restart. A follower is at the end
            // most of the time: there the broker holds its fetch until records come (the
            // default), instead of being asked a hundred times a second.
            .set("fetch.wait.max.ms", if follow { "500" } else { "10" })
            .set("group.id", "streamapp-restore-unused");
        // The engine's bounded buffer, and above all its short fetch back-off: a reader that
        // fetches faster than the store applies fills librdkafka's queue, and with the default
        // back-off (1 s) each partition then waited a second for its next fetch while the
        // queue drained in a fraction of one. A full restore of 1M ids ran at about 120,000
        // records/s, its thread waiting in three of four samples (docs/performance.md).
        crate::engine::bound_consumer_buffer(&mut reader_cfg);
        let reader: BaseConsumer<ReaderContext> = reader_cfg.create_with_context(ReaderContext)?;
        Ok(Restorer {
            topic: topic.to_string(),
            follow,
            records: RecordQueue::new(&reader),
            reader,
            ends: HighWatermarks::new(base, topic)?,
            partitions: BTreeMap::new(),
            skipped: BTreeMap::new(),
            kafka_warned_at: None,
            last_topic: None,
            bulk: BTreeMap::new(),
        })
    }

    /// Kafka is away: says so at most every [`KAFKA_WARN_EVERY`].
    fn kafka_away(&mut self, partition: Option<i32>, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        if self
            .kafka_warned_at
            .is_none_or(|t| now - t >= KAFKA_WARN_EVERY)
        {
            self.kafka_warned_at = Some(now);
            warn!(topic = %self.topic, ?partition, %error,
                "Kafka does not answer the changelog reader; waiting for it (librdkafka reconnects by itself)");
        }
    }

    fn skip(&mut self, partition: i32, offset: i64, reason: &'static str) {
        let s = self.skipped.entry(partition).or_default();
        s.records += 1;
        s.last_offset = offset;
        s.last_reason = reason;
    }

    /// The records skipped since the last call, by partition.
    pub fn take_skipped(&mut self) -> BTreeMap<i32, Skipped> {
        std::mem::take(&mut self.skipped)
    }

    fn kafka_err(&self, partition: i32) -> impl Fn(KafkaError) -> RestoreError + '_ {
        move |source| RestoreError::Kafka {
            topic: self.topic.clone(),
            partition,
            source,
        }
    }

    /// Whether `partition` is being read (restoring, and not waiting for an open transaction
    /// to end).
    pub fn reading(&self, partition: i32) -> bool {
        self.partitions
            .get(&partition)
            .is_some_and(|s| s.recheck_at.is_none())
    }

    /// Adds the partition to the reader at the store's offset. Returns the number of records
    /// to restore (an upper bound: compaction and transaction markers make it smaller).
    ///
    /// When Kafka does not answer, the partition waits (see [`Partition::unchecked`]) and the
    /// number is 0: the reader checks and starts it once Kafka answers.
    pub fn begin(&mut self, partition: i32, store: &TaskStore) -> Result<u64, RestoreError> {
        self.stop(partition);
        // A standby's store follows the changelog record by record once caught up: it is
        // restored the usual way throughout.
        if !self.follow
            && let Some(load) = store.bulk_load()?
        {
            info!(
                partition,
                "the store is empty: restoring it in sorted runs ingested as files"
            );
            self.bulk.insert(partition, (load, Run::default()));
        }
        match self.start_reading(partition, store) {
            Ok(to_restore) => {
                self.partitions.insert(partition, Partition::default());
                Ok(to_restore)
            }
            Err(e) if e.is_transient() => {
                self.kafka_away(Some(partition), &e);
                self.partitions.insert(
                    partition,
                    Partition {
                        recheck_at: Some(Instant::now() + KAFKA_RECHECK),
                        unchecked: true,
                        ..Partition::default()
                    },
                );
                Ok(0)
            }
            Err(e) => {
                // Not restoring: the load's part of the memtable budget goes back now.
                self.bulk.remove(&partition);
                Err(e)
            }
        }
    }

    /// Checks the store's offset against the changelog partition and adds the partition to
    /// the reader there; the number of records to restore.
    fn start_reading(&self, partition: i32, store: &TaskStore) -> Result<u64, RestoreError> {
        let from = store.meta().changelog_offset;
        let (low, high) = self
            .ends
            .watermarks(partition)
            .map_err(self.kafka_err(partition))?;
        if let Some(offset) = from.filter(|o| *o > high) {
            return Err(RestoreError::AheadOfChangelog {
                topic: self.topic.clone(),
                partition,
                offset,
                end: high,
            });
        }
        if let Some(offset) = from.filter(|o| *o < low) {
            // Retention deleted records the store never applied: they were older than the
            // changelog's retention (the window plus a day), so their ids expired anyway.
            info!(
                partition,
                store_offset = offset,
                log_start = low,
                "the changelog's start moved past the store's offset; restoring from its start"
            );
        }
        // From the log's start when retention moved past the store's offset.
        self.read_from(partition, from.map(|o| o.max(low)))?;
        Ok((high - from.unwrap_or(low).max(low)).max(0) as u64)
    }

    /// Adds the partition to the reader's assignment at `from` (the start when `None`).
    fn read_from(&self, partition: i32, from: Option<i64>) -> Result<(), RestoreError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            &self.topic,
            partition,
            from.map_or(Offset::Beginning, Offset::Offset),
        )
        .map_err(self.kafka_err(partition))?;
        self.records
            .take_partition(&self.reader, &self.topic, partition)
            .map_err(self.kafka_err(partition))?;
        self.reader
            .incremental_assign(&tpl)
            .map_err(self.kafka_err(partition))
    }

    fn unassign(&self, partition: i32) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        if let Err(e) = self.reader.incremental_unassign(&tpl) {
            warn!(partition, error = %e, "could not remove a changelog partition from the restore reader");
        }
    }

    /// Stops restoring `partition` (it is restored, or its task is gone or starts over).
    pub fn stop(&mut self, partition: i32) {
        self.bulk.remove(&partition);
        if let Some(p) = self.partitions.remove(&partition)
            && p.recheck_at.is_none()
        {
            self.unassign(partition);
        }
    }

    /// Stops restoring every partition (a revoke).
    pub fn stop_all(&mut self) {
        let _ = self.reader.unassign();
        self.partitions.clear();
        self.bulk.clear();
    }

    /// Reads up to `budget` records in all into the stores of the partitions being restored
    /// (`stores`: those partitions' stores; others are left alone). Returns, for each partition
    /// in `stores`, how many records were applied and where its restore stands, or what went
    /// wrong with it; an error of the reader itself fails the whole step.
    pub fn step(
        &mut self,
        stores: &mut BTreeMap<i32, &mut TaskStore>,
        budget: usize,
    ) -> Result<Vec<(i32, PartitionStep)>, RestoreError> {
        let failed: BTreeMap<i32, RestoreError> = self.recheck_waiting(stores)?;
        // librdkafka drops a partition's forward when its fetch stops, at a time of its own:
        // a partition removed and added again (a recheck, a task that starts over) may have
        // lost the forward `read_from` set just before. Set again, it brings what the partition
        // fetched meanwhile along.
        for (&p, state) in &self.partitions {
            if state.recheck_at.is_none() {
                self.records
                    .take_partition(&self.reader, &self.topic, p)
                    .map_err(self.kafka_err(p))?;
            }
        }
        // A bulk load's run goes on filling where the last step left it.
        let staged: BTreeMap<i32, Pending> = std::mem::take(&mut self.bulk)
            .into_iter()
            .map(|(p, (load, run))| (p, Pending::Run(load, run)))
            .collect();

        let mut progress = StepProgress {
            staged,
            failed,
            ..StepProgress::default()
        };
        let mut kafka_away: Option<KafkaError> = None;
        let mut batch = Batch::with_capacity(READ_BATCH);
        let deadline = Instant::now() + STEP_TIME;
        let mut had_records = false;
        loop {
            let reading = stores.keys().any(|p| {
                !progress.at_end.contains_key(p)
                    && !progress.failed.contains_key(p)
                    && self
                        .partitions
                        .get(p)
                        .is_some_and(|s| s.recheck_at.is_none())
            });
            if progress.read >= budget || !reading || Instant::now() >= deadline {
                break;
            }
            // A follower takes what its reader has fetched and does not wait for more: the
            // state updater waits between its steps, serving requests meanwhile. Right after a
            // batch the next one is most likely fetched already.
            let wait = if self.follow || had_records {
                Duration::ZERO
            } else {
                Duration::from_millis(50)
            };
            let taken = self.records.read(wait, &mut batch, budget - progress.read);
            had_records = taken > 0;
            // A batch is taken whole: the reader's position is already past all of it.
            let mut errors = Vec::new();
            for fetched in batch.iter() {
                match fetched {
                    Fetched::Record {
                        partition,
                        offset,
                        key,
                        payload,
                    } => progress.take(
                        stores,
                        &mut self.last_topic,
                        partition,
                        offset,
                        key,
                        payload,
                    ),
                    Fetched::End {
                        partition,
                        position,
                    } => {
                        progress.at_end.insert(partition, Some(position));
                    }
                    Fetched::Error(e) => errors.push(e),
                }
            }
            if taken == 0 {
                // The reader's own queue: errors about Kafka as a whole (no broker answers).
                // A record there was fetched before its partition's records were taken
                // (`read_from`); none is expected.
                match self.reader.poll(Duration::ZERO) {
                    None if self.follow => break,
                    None => {}
                    Some(Ok(m)) => progress.take(
                        stores,
                        &mut self.last_topic,
                        m.partition(),
                        m.offset(),
                        m.key(),
                        m.payload(),
                    ),
                    Some(Err(e)) => errors.push(e),
                }
            }
            for e in errors {
                match e {
                    // Not expected on the reader's own queue (see above): the reader's position
                    // then says where the partition ends.
                    KafkaError::PartitionEOF(p) => {
                        progress.at_end.entry(p).or_insert(None);
                    }
                    // Kafka away for a while: librdkafka reconnects and fetches again by itself.
                    e if reader_error_is_transient(&e) => kafka_away = Some(e),
                    // Not about one partition: the reader itself failed (-1 names none).
                    e => return Err(self.kafka_err(-1)(e)),
                }
            }
            if kafka_away.is_some() {
                break;
            }
        }
        let StepProgress {
            mut staged,
            applied,
            mut failed,
            at_end,
            skips,
            ..
        } = progress;
        if let Some(e) = kafka_away {
            self.kafka_away(None, &e);
        }
        for (p, offset, what) in skips {
            self.skip(p, offset, what);
        }
        let mut results = Vec::new();
        for (&p, store) in stores.iter_mut() {
            if !self.partitions.contains_key(&p) {
                continue;
            }
            let mut chunk = staged.remove(&p).unwrap_or_else(Pending::chunk);
            let result = match failed.remove(&p) {
                Some(e) => Err(e),
                None if let Some(&end) = at_end.get(&p) => self
                    .finish_at_end(p, end, store, &mut chunk)
                    .map(|(n, step)| (applied.get(&p).copied().unwrap_or(0) + n, step)),
                None => {
                    let state = &self.partitions[&p];
                    let step = match (state.recheck_at.is_some(), state.unchecked) {
                        (_, true) => Step::WaitingForKafka,
                        (true, false) => Step::WaitingForOpenTransaction,
                        (false, false) => Step::InProgress,
                    };
                    let applied_before = applied.get(&p).copied().unwrap_or(0);
                    match chunk {
                        // Kept until the run is full or the partition's end is reached.
                        Pending::Run(..) => Ok((applied_before, step)),
                        Pending::Chunk(_) if chunk.is_empty() => Ok((applied_before, step)),
                        Pending::Chunk(_) => chunk
                            .apply(store)
                            .map(|n| (applied_before + n, step))
                            .map_err(RestoreError::from),
                    }
                }
            };
            if matches!(result, Ok((_, Step::Done)) | Err(_)) {
                self.stop(p);
            } else if let Pending::Run(load, run) = chunk {
                self.bulk.insert(p, (load, run));
            }
            results.push((p, result));
        }
        // Runs of partitions the caller did not hand over this time go on next time.
        for (p, pending) in staged {
            if let Pending::Run(load, run) = pending
                && self.partitions.contains_key(&p)
            {
                self.bulk.insert(p, (load, run));
            }
        }
        Ok(results)
    }

    /// Puts partitions whose wait for an open transaction is due for a look back into the
    /// reader, from their store's offset: the transaction's records become visible once it
    /// ends.
    ///
    /// A partition whose restore began while Kafka did not answer is checked first; one that
    /// fails that check for good is returned with why.
    fn recheck_waiting(
        &mut self,
        stores: &BTreeMap<i32, &mut TaskStore>,
    ) -> Result<BTreeMap<i32, RestoreError>, RestoreError> {
        let now = Instant::now();
        let due: Vec<i32> = self
            .partitions
            .iter()
            .filter(|(_, s)| s.recheck_at.is_some_and(|t| now >= t))
            .map(|(&p, _)| p)
            .collect();
        let mut failed = BTreeMap::new();
        for p in due {
            let Some(store) = stores.get(&p) else {
                continue;
            };
            let outcome = if self.partitions[&p].unchecked {
                self.start_reading(p, store).map(|_| ())
            } else {
                self.read_from(p, store.meta().changelog_offset)
            };
            let state = self.partitions.get_mut(&p).expect("restoring");
            match outcome {
                Ok(()) => {
                    state.recheck_at = None;
                    state.unchecked = false;
                }
                Err(e) if e.is_transient() => {
                    state.recheck_at = Some(now + KAFKA_RECHECK);
                    self.kafka_away(Some(p), &e);
                }
                Err(e) if state.unchecked => {
                    failed.insert(p, e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(failed)
    }

    /// The reader reached the visible end of `partition`: applies what is left and decides
    /// whether that is the log's real end.
    fn finish_at_end(
        &mut self,
        partition: i32,
        position: Option<i64>,
        store: &mut TaskStore,
        staged: &mut Pending,
    ) -> Result<(u64, Step), RestoreError> {
        // Past the last record and any transaction markers.
        let position = match position {
            Some(p) => Some(p),
            None => self.position(partition)?,
        };
        if let Some(p) = position {
            let offset = staged.changelog_offset();
            *offset = Some(p.max(offset.unwrap_or(0)));
        }
        let applied = if staged.is_empty() {
            0
        } else {
            staged.apply(store)?
        };
        if self.follow {
            return Ok((applied, Step::Following));
        }
        let end = match self
            .ends
            .end_offset(partition)
            .map_err(self.kafka_err(partition))
        {
            Ok(end) => end,
            Err(e) if e.is_transient() => {
                self.kafka_away(Some(partition), &e);
                let state = self.partitions.get_mut(&partition).expect("restoring");
                state.recheck_at = Some(Instant::now() + KAFKA_RECHECK);
                self.unassign(partition);
                return Ok((applied, Step::WaitingForKafka));
            }
            Err(e) => return Err(e),
        };
        let caught_up = store.meta().changelog_offset.unwrap_or(0) >= end || end == 0;
        let state = self.partitions.get_mut(&partition).expect("restoring");
        if caught_up {
            if state.waiting_since.take().is_some() {
                info!(
                    partition,
                    "open transaction on the changelog ended; restore continues"
                );
            }
            return Ok((applied, Step::Done));
        }
        let now = Instant::now();
        state.waiting_since.get_or_insert(now);
        if state
            .warned_at
            .or(state.waiting_since)
            .is_some_and(|t| now - t > Duration::from_secs(5))
        {
            let visible_end = store.meta().changelog_offset.unwrap_or(0);
            warn!(
                topic = %self.topic,
                partition,
                visible_end,
                end,
                "waiting for an open transaction to end on {}/{partition}, at offset \
                 {visible_end} (its coordinator aborts a live one after \
                 transaction.timeout.ms; one that hangs, as a broker crash can leave, the \
                 operator's transaction doctor ends, see the condition TransactionsHealthy; by \
                 hand: kafka-transactions.sh abort --topic {} --partition {partition} \
                 --start-offset {visible_end})",
                self.topic,
                self.topic
            );
            state.warned_at = Some(now);
        }
        // Out of the reader until the recheck: the other partitions go on meanwhile.
        state.recheck_at = Some(now + WAIT_RECHECK);
        self.unassign(partition);
        Ok((applied, Step::WaitingForOpenTransaction))
    }

    fn position(&self, partition: i32) -> Result<Option<i64>, RestoreError> {
        let tpl = self.reader.position().map_err(self.kafka_err(partition))?;
        Ok(tpl
            .find_partition(&self.topic, partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            }))
    }
}

/// What one [`Restorer::step`] has read so far, partition by partition.
#[derive(Default)]
struct StepProgress {
    /// Read and not written yet.
    staged: BTreeMap<i32, Pending>,
    /// Records written to the store in this step.
    applied: BTreeMap<i32, u64>,
    /// Partitions whose restore failed: read no further.
    failed: BTreeMap<i32, RestoreError>,
    /// Partitions at their visible end.
    /// Partitions at their visible end, with the position it was reached at (none: ask the
    /// reader).
    at_end: BTreeMap<i32, Option<i64>>,
    read: usize,
    /// Undecodable records (partition, offset, what): counted once the reader is done.
    skips: Vec<(i32, i64, &'static str)>,
}

impl StepProgress {
    /// Stages one changelog record of `partition`, and writes its chunk once full.
    /// `last_topic`: the source topic of the last sighting read, shared with the next.
    fn take(
        &mut self,
        stores: &mut BTreeMap<i32, &mut TaskStore>,
        last_topic: &mut Option<Arc<str>>,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
    ) {
        let Some(store) = stores.get_mut(&partition) else {
            return; // stopped meanwhile; the reader drops it
        };
        if self.failed.contains_key(&partition) {
            return;
        }
        self.read += 1;
        let chunk = self.staged.entry(partition).or_insert_with(Pending::chunk);
        match ChangelogRecord::of(key, payload, last_topic.as_ref()) {
            ChangelogRecord::Sighting { id, sighting } => {
                if let Some(source) = &sighting.source {
                    *last_topic = Some(source.topic.clone());
                }
                chunk.put_sighting(id, sighting)
            }
            ChangelogRecord::Tombstone { id } => chunk.forget(id),
            ChangelogRecord::Undecodable(what) => self.skips.push((partition, offset, what)),
        }
        chunk.read_through(offset);
        if chunk.full() {
            match chunk.apply(store) {
                Ok(n) => *self.applied.entry(partition).or_default() += n,
                Err(e) => {
                    self.failed.insert(partition, e.into());
                }
            }
        }
    }
}

/// Changelog records a reader skipped on one partition since it was last asked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub records: u64,
    /// The last one: its offset and what was wrong with it.
    pub last_offset: i64,
    pub last_reason: &'static str,
}
