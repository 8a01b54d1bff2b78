//! One consumed record inside the open transaction: the dedup topology (id, time, duplicate or
//! first occurrence, the `enrich` stage), its records to Kafka, and dead letters. The route
//! stage's side is in [`super::routing`].
//!
//! A record that failed before is processed alone (its own transaction), and after
//! `topology.maxRecordAttempts` failed attempts it becomes a dead letter: see
//! [`crate::record_attempts`].

use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use streamapp_api::health::DeadLetterNote;
use tracing::warn;

use super::consumed::Consumed;
use super::delivery::{Origin, ProduceError};
use super::transaction::Outgoing;
use super::{Engine, EngineError, GroupConsumer, Stage};
use crate::faults::FAULT_HEADER;
use crate::lifecycle::Event;
use crate::record_attempts::{FailureKind, Failures, RecordAttempts, Verdict};
use crate::shared::now_ms;
use crate::store::{MAX_ENCODED, Sighting, StoreError};
use crate::topology::{self, RecordView, Rejection};

/// Longest part of an error message put into a dead letter's header.
const DLQ_ERROR_MAX: usize = 1024;

/// Why processing one record did not work out.
pub(super) enum RecordError {
    /// A stage of the topology failed on it.
    Stage(String),
    /// Kafka refused one of its records when it was handed over.
    Produce(ProduceError),
    /// The task's store failed.
    Store(StoreError),
}

impl From<ProduceError> for RecordError {
    fn from(e: ProduceError) -> Self {
        RecordError::Produce(e)
    }
}

impl Engine {
    /// Processes one consumed record inside the open transaction: a record of the input
    /// topic goes to the route stage when the topology repartitions, everything else to the
    /// dedup stage.
    pub fn process(
        &mut self,
        consumer: &GroupConsumer,
        m: &BorrowedMessage<'_>,
    ) -> Result<(), EngineError> {
        // Read once: each read of a message's topic is a strlen and a UTF-8 check.
        let topic = m.topic();
        let from_input = topic == self.cfg.topology.input_topic;
        let stage = if from_input && self.cfg.repartition_topic.is_some() {
            Stage::Route
        } else {
            Stage::Dedup
        };
        let (p, offset) = (m.partition(), m.offset());
        if !self.takes(stage, p, offset) {
            return Ok(());
        }
        let verdict = self.attempts_of(stage).verdict(p, offset);
        if verdict != Verdict::Process && self.txn.is_open() {
            // A record that failed before gets a transaction of its own: what is open now
            // commits first, so its next failure costs nothing but itself.
            let aborts = self.txn.aborts();
            self.commit(consumer)?;
            if self.txn.aborts() != aborts || !self.takes(stage, p, offset) {
                return Ok(()); // rewound: it comes again in order
            }
        }
        self.txn.begin()?;
        let record = Consumed::of(
            m,
            topic,
            stage,
            self.cfg.repartition_topic.is_some(),
            self.wall_ms,
        );
        if from_input {
            self.metrics.records_in.inc();
        }
        let outcome = match (&verdict, stage) {
            (Verdict::DeadLetter(failures), _) => self.dead_letter_failed(&record, failures),
            (_, Stage::Route) => self.route_record(&record),
            (_, Stage::Dedup) => self.process_record(p, &record),
        };
        match stage {
            Stage::Route => self.routes.processed(p, offset),
            Stage::Dedup => self.dedup.processed(p, offset),
        }
        match outcome {
            Ok(()) if verdict == Verdict::Process => Ok(()),
            Ok(()) => self.commit(consumer),
            Err(RecordError::Stage(why)) => {
                self.record_failed(record.origin(), FailureKind::Processing, why.clone(), false);
                self.abort(consumer, &why);
                Ok(())
            }
            Err(RecordError::Produce(e)) => self.on_produce_errors(consumer, vec![e]),
            Err(RecordError::Store(e)) => {
                self.abort(consumer, "state store error");
                self.on_task_event(
                    p,
                    Event::StoreFailed {
                        fault: e.fault(),
                        reason: e.reason().to_string(),
                    },
                );
                Ok(())
            }
        }
    }

    fn attempts_of(&mut self, stage: Stage) -> &mut RecordAttempts {
        match stage {
            Stage::Route => self.routes.attempts(),
            Stage::Dedup => &mut self.dedup.attempts,
        }
    }

    /// Whether the record at `offset` is the next one of an active task (not one fetched
    /// before a rewind, a pause or a reassignment: those come again in order).
    fn takes(&self, stage: Stage, p: i32, offset: i64) -> bool {
        self.paused_until.is_none()
            && match stage {
                Stage::Route => self.routes.takes(p, offset),
                Stage::Dedup => self.dedup.takes(p, offset),
            }
    }

    pub(super) fn record_failed(
        &mut self,
        origin: Origin,
        kind: FailureKind,
        error: String,
        too_large: bool,
    ) {
        let attempts = self.attempts_of(origin.stage).failed(
            origin.partition,
            origin.offset,
            kind,
            error.clone(),
            too_large,
        );
        self.metrics
            .record_failures
            .get_or_create(&crate::metrics::Metrics::kind(kind))
            .inc();
        warn!(stage = ?origin.stage, partition = origin.partition, offset = origin.offset, attempts,
            max_attempts = self.cfg.topology.max_record_attempts, kind = kind.reason(), error = %error,
            "record failed; it is tried again on its own, and dead-lettered after the last attempt");
    }

    /// The record's dedup id, or why it cannot be processed: the id (the key of a repartition
    /// record, else where `topology.dedupId` says), and a time not too far ahead. Both stages
    /// ask this first; a rejection becomes a dead letter.
    pub(super) fn admit(&self, record: &Consumed<'_>) -> Result<Vec<u8>, Rejection> {
        let id = match record.id {
            Some(id) => id.to_vec(),
            None => {
                let header = |name: &str| record.header(name);
                let view = RecordView {
                    key: record.key,
                    value: record.value,
                    header: &header,
                };
                topology::extract_id(
                    &view,
                    &self.cfg.topology.dedup_id,
                    self.cfg.topology.max_value_bytes,
                )?
            }
        };
        topology::check_time(
            record.time,
            self.wall_ms,
            self.cfg.topology.max_skew.as_millis() as i64,
        )?;
        Ok(id)
    }

    /// Sends a record the topology refused to the dead-letter topic, saying why.
    pub(super) fn refuse(
        &mut self,
        record: &Consumed<'_>,
        rejection: &Rejection,
    ) -> Result<(), RecordError> {
        self.dead_letter(
            record,
            rejection.code(),
            &rejection.detail(),
            rejection.metadata_only(),
        )
    }

    fn process_record(&mut self, p: i32, record: &Consumed<'_>) -> Result<(), RecordError> {
        let id = match self.admit(record) {
            Ok(id) => id,
            Err(rejection) => return self.refuse(record, &rejection),
        };
        if self.cfg.topology.check_keying && record.key != Some(id.as_slice()) {
            self.txn.note_miskeyed();
        }
        let origin = record.origin();
        let task = self.dedup.tasks.get_mut(&p).expect("task exists");
        let store = task.store.as_ref().expect("an active task has its store");
        let first_seen = match task.staged.puts.get(&id) {
            Some(held) => Some(held.time),
            None => store.first_seen(&id).map_err(RecordError::Store)?,
        };
        if topology::is_duplicate(
            first_seen,
            record.time,
            self.cfg.topology.retention.as_millis() as i64,
        ) {
            self.metrics.duplicates.inc();
            if let Some(topic) = &self.cfg.topology.duplicates_topic {
                let out = Outgoing {
                    topic,
                    partition: None,
                    key: record.key,
                    value: record.value,
                    headers: Some(record.headers_with_id(&id)),
                    timestamp: Some(record.time),
                };
                self.txn.send(out, origin)?;
            }
            return Ok(());
        }
        // Not a duplicate. The store keeps the later of two first sightings: an out-of-order
        // record older than the store's by more than the retention leaves it as it is, so
        // every staged put is newer than what the store holds and the apply after the commit
        // need not read it again.
        let kept = topology::kept_sighting(first_seen, record.time);
        // The changelog says what the store keeps, not the record's own time: compaction
        // keeps only an id's last changelog record, and a store rebuilt from it (a new pod, a
        // standby, a quarantine) must decide as this one does, and name the same source.
        let mut value = [0u8; MAX_ENCODED];
        let len = if kept == record.time {
            let sighting = Sighting {
                time: kept,
                source: record.sighting_source(&self.dedup.input_topic),
            };
            let len = sighting.encode(&mut value);
            task.staged.put_sighting(&id, sighting);
            len
        } else {
            // Rare: the kept sighting is the one held (staged or in the store), source and all.
            let held = match task.staged.puts.get(&id) {
                Some(held) => held.clone(),
                None => store
                    .sighting(&id, Some(&self.dedup.input_topic))
                    .map_err(RecordError::Store)?
                    .unwrap_or(Sighting::at(kept)),
            };
            held.encode(&mut value)
        };
        self.txn.send(
            Outgoing {
                topic: &self.cfg.changelog_topic,
                partition: Some(p),
                key: Some(&id),
                value: Some(&value[..len]),
                headers: None,
                // The wall clock (the changelog's retention counts from it), as of the last
                // tick: one clock read per tick instead of librdkafka's per record.
                timestamp: Some(self.wall_ms),
            },
            origin,
        )?;
        // The downstream `enrich` stage: the place where a failure after the put would leave
        // an aborted write in a store that applied writes eagerly.
        if self
            .faults
            .after_put(|| record.header(FAULT_HEADER))
            .is_err()
        {
            return Err(RecordError::Stage(
                "injected failure in the enrich stage".into(),
            ));
        }
        self.txn.send(
            Outgoing {
                topic: &self.cfg.topology.output_topic,
                partition: None,
                key: record.key,
                value: record.value,
                headers: Some(record.headers_with_id(&id)),
                timestamp: Some(record.time),
            },
            origin,
        )?;
        self.metrics.records_out.inc();
        Ok(())
    }

    /// The dead letter of a record that failed every attempt.
    fn dead_letter_failed(
        &mut self,
        record: &Consumed<'_>,
        failures: &Failures,
    ) -> Result<(), RecordError> {
        let detail = format!(
            "failed {} attempts; the last one: {}",
            failures.attempts, failures.error
        );
        self.dead_letter(record, failures.kind.reason(), &detail, failures.too_large)
    }

    /// Sends `record` to the dead-letter topic with `reason`. `metadata_only`: the record's
    /// size is the problem, so the dead letter carries headers that say why and where the
    /// original is (it stays in the input topic), not its key, value or headers.
    pub(super) fn dead_letter(
        &mut self,
        record: &Consumed<'_>,
        reason: &str,
        detail: &str,
        metadata_only: bool,
    ) -> Result<(), RecordError> {
        let source = record.source();
        warn!(
            source = %source,
            reason,
            detail,
            "record to the dead-letter topic"
        );
        let mut cut = detail.len().min(DLQ_ERROR_MAX);
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        let base = if metadata_only {
            OwnedHeaders::new()
        } else {
            record.copy_headers()
        };
        let mut headers = base
            .insert(Header {
                key: topology::DLQ_REASON_HEADER,
                value: Some(reason),
            })
            .insert(Header {
                key: topology::DLQ_SOURCE_HEADER,
                value: Some(&source),
            })
            .insert(Header {
                key: topology::DLQ_ERROR_HEADER,
                value: Some(&detail[..cut]),
            });
        if metadata_only {
            let size = record.value.map_or(0, <[u8]>::len).to_string();
            headers = headers.insert(Header {
                key: topology::DLQ_ORIGINAL_SIZE_HEADER,
                value: Some(&size),
            });
        }
        let (key, value) = if metadata_only {
            (None, None)
        } else {
            (record.key, record.value)
        };
        self.txn.send(
            Outgoing {
                topic: &self.cfg.topology.dead_letter_topic,
                partition: None,
                key,
                value,
                headers: Some(headers),
                timestamp: None,
            },
            record.origin(),
        )?;
        self.txn.note_dead_letter(DeadLetterNote {
            at_ms: now_ms(),
            reason: reason.to_string(),
            source,
            detail: detail.to_string(),
        });
        Ok(())
    }
}
