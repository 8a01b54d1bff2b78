//! Replaying a changelog partition into a task's store, from the store's own offset to the end.
//!
//! A store whose offset is past the end of the changelog cannot be a prefix of it (the
//! changelog was deleted and recreated, or lost data): restore refuses to mix the two
//! ([`RestoreError::AheadOfChangelog`]), and the task rebuilds the store from the log as it is.
//!
//! The changelog is read with read_committed, so aborted writes never reach the store. Restore
//! is done in steps (a bounded number of records each) so the processing thread keeps serving
//! the group consumer meanwhile. It is finished only when the visible end of the partition is
//! its real end: while another producer (a previous owner of the task) still has a transaction
//! open on it, records after it may yet become visible, so restore waits for it to end.

use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};

use crate::store::{Staged, StoreError, TaskStore};

/// Records applied to RocksDB per batch while restoring.
const APPLY_CHUNK: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("reading changelog {topic} partition {partition}: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        source: KafkaError,
    },
    #[error("changelog {topic} partition {partition} offset {offset}: {what}")]
    BadRecord {
        topic: String,
        partition: i32,
        offset: i64,
        what: String,
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

#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// More to read.
    InProgress,
    /// At the visible end, but a transaction of another producer is still open on the
    /// partition: wait for it to commit or abort.
    WaitingForOpenTransaction,
    /// Caught up with the changelog.
    Done,
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

/// Reads changelog partitions for restore. One partition at a time.
pub struct Restorer {
    topic: String,
    /// read_committed, partition EOF events on.
    reader: BaseConsumer<ReaderContext>,
    /// read_uncommitted: its high watermark is the real end of the log.
    end_probe: BaseConsumer,
    current: Option<i32>,
    waiting_since: Option<Instant>,
}

impl Restorer {
    pub fn new(base: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        let mut reader_cfg = base.clone();
        reader_cfg
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            // A catch-up reader: at the end of the partition the broker answers at once
            // instead of holding the fetch for new records (500 ms by default), which would
            // add up to a second per partition to every restart.
            .set("fetch.wait.max.ms", "10")
            .set("group.id", "streamapp-restore-unused");
        let mut probe_cfg = base.clone();
        probe_cfg
            .set("isolation.level", "read_uncommitted")
            .set("group.id", "streamapp-restore-unused");
        Ok(Restorer {
            topic: topic.to_string(),
            reader: reader_cfg.create_with_context(ReaderContext)?,
            end_probe: probe_cfg.create()?,
            current: None,
            waiting_since: None,
        })
    }

    fn kafka_err(&self, partition: i32) -> impl Fn(KafkaError) -> RestoreError + '_ {
        move |source| RestoreError::Kafka {
            topic: self.topic.clone(),
            partition,
            source,
        }
    }

    /// The real end (high watermark) of a changelog partition.
    pub fn end_offset(&self, partition: i32) -> Result<i64, RestoreError> {
        let (_, high) = self
            .end_probe
            .fetch_watermarks(&self.topic, partition, Duration::from_secs(10))
            .map_err(self.kafka_err(partition))?;
        Ok(high)
    }

    /// The partition being restored, if any.
    pub fn current(&self) -> Option<i32> {
        self.current
    }

    /// Positions the reader at the store's offset. Returns the number of records to restore
    /// (an upper bound: compaction and transaction markers make it smaller).
    pub fn begin(&mut self, partition: i32, store: &TaskStore) -> Result<u64, RestoreError> {
        let from = store.meta().changelog_offset;
        let (low, high) = self
            .end_probe
            .fetch_watermarks(&self.topic, partition, Duration::from_secs(10))
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
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            &self.topic,
            partition,
            from.map_or(Offset::Beginning, Offset::Offset),
        )
        .map_err(self.kafka_err(partition))?;
        self.reader
            .assign(&tpl)
            .map_err(self.kafka_err(partition))?;
        self.current = Some(partition);
        self.waiting_since = None;
        Ok((high - from.unwrap_or(low).max(low)).max(0) as u64)
    }

    /// Reads up to `budget` records into the store. Returns how many were applied and where
    /// restore stands.
    pub fn step(
        &mut self,
        partition: i32,
        store: &mut TaskStore,
        budget: usize,
    ) -> Result<(u64, Step), RestoreError> {
        assert_eq!(self.current, Some(partition), "begin() first");
        let mut staged = Staged::default();
        let mut applied = 0u64;
        let mut at_end = false;
        let deadline = Instant::now() + Duration::from_millis(500);
        while (applied as usize) + staged.puts.len() < budget && Instant::now() < deadline {
            match self.reader.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(m)) => {
                    let bad = |what: &str| RestoreError::BadRecord {
                        topic: self.topic.clone(),
                        partition,
                        offset: m.offset(),
                        what: what.into(),
                    };
                    let id = m.key().ok_or_else(|| bad("record without a key"))?;
                    let value: [u8; 8] = m
                        .payload()
                        .and_then(|p| p.try_into().ok())
                        .ok_or_else(|| bad("value is not an 8-byte time"))?;
                    staged.put(id, i64::from_be_bytes(value));
                    staged.changelog_offset = Some(m.offset() + 1);
                    if staged.puts.len() >= APPLY_CHUNK {
                        applied += staged.puts.len() as u64;
                        store.apply(&staged)?;
                        staged.clear();
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    at_end = true;
                    break;
                }
                Some(Err(e)) => return Err(self.kafka_err(partition)(e)),
            }
        }
        if !at_end {
            applied += staged.puts.len() as u64;
            if !staged.is_empty() {
                store.apply(&staged)?;
            }
            return Ok((applied, Step::InProgress));
        }
        // At the visible end: the reader's position is past the last record and any
        // transaction markers. If that is the log's real end, the store is caught up.
        let position = self.position(partition)?;
        let end = self.end_offset(partition)?;
        applied += staged.puts.len() as u64;
        if let Some(p) = position {
            staged.changelog_offset = Some(p.max(staged.changelog_offset.unwrap_or(0)));
        }
        if !staged.is_empty() {
            store.apply(&staged)?;
        }
        let caught_up = store.meta().changelog_offset.unwrap_or(0) >= end || end == 0;
        if caught_up {
            if self.waiting_since.take().is_some() {
                info!(
                    partition,
                    "open transaction on the changelog ended; restore continues"
                );
            }
            return Ok((applied, Step::Done));
        }
        match self.waiting_since {
            None => self.waiting_since = Some(Instant::now()),
            Some(since) if since.elapsed() > Duration::from_secs(5) => {
                warn!(
                    partition,
                    visible_end = store.meta().changelog_offset,
                    end,
                    "waiting for an open transaction of a previous owner to end on the changelog \
                     (the coordinator aborts it after transaction.timeout.ms; if this goes on \
                     for minutes, the transaction hangs, which a broker crash can cause: find it \
                     with kafka-transactions.sh find-hanging and end it with kafka-transactions.sh \
                     abort --topic <changelog> --partition <partition> --start-offset <visible_end>)"
                );
                self.waiting_since = Some(Instant::now());
            }
            _ => {}
        }
        // Re-read from where we are: the transaction's records become visible once it ends.
        let mut tpl = TopicPartitionList::new();
        let from = store
            .meta()
            .changelog_offset
            .map_or(Offset::Beginning, Offset::Offset);
        tpl.add_partition_offset(&self.topic, partition, from)
            .map_err(self.kafka_err(partition))?;
        self.reader
            .assign(&tpl)
            .map_err(self.kafka_err(partition))?;
        std::thread::sleep(Duration::from_millis(200));
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

    /// Stops reading (the task is restored or gone).
    pub fn finish(&mut self) {
        let _ = self.reader.unassign();
        self.current = None;
        self.waiting_since = None;
    }
}
