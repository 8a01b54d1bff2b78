//! One consumed record inside the open transaction: the dedup topology (id, time, duplicate or
//! first occurrence, the `enrich` stage), its records to Kafka, and dead letters. The route
//! stage's side is in [`super::routing`].
//!
//! A record that failed before is processed alone (its own transaction), and after
//! `topology.maxRecordAttempts` failed attempts it becomes a dead letter: see
//! [`crate::record_attempts`].

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use streamapp_api::health::DeadLetterNote;
use tracing::warn;

use super::consumed::Consumed;
use super::delivery::{Origin, ProduceError};
use super::{Engine, EngineError, GroupConsumer, OpenTxn, Stage};
use crate::faults::FAULT_HEADER;
use crate::kafka_errors::{ProduceFailure, classify_produce};
use crate::lifecycle::Event;
use crate::record_attempts::{FailureKind, Failures, RecordAttempts, Verdict};
use crate::shared::now_ms;
use crate::store::StoreError;
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

impl Engine {
    /// Processes one consumed record inside the open transaction: a record of the input
    /// topic goes to the route stage when the topology repartitions, everything else to the
    /// dedup stage.
    pub fn process(
        &mut self,
        consumer: &GroupConsumer,
        m: &BorrowedMessage<'_>,
    ) -> Result<(), EngineError> {
        let stage = self.stage_of(m.topic());
        let (p, offset) = (m.partition(), m.offset());
        if !self.takes(stage, p, offset) {
            return Ok(());
        }
        let verdict = self.attempts_of(stage).verdict(p, offset);
        if verdict != Verdict::Process && self.txn.is_some() {
            // A record that failed before gets a transaction of its own: what is open now
            // commits first, so its next failure costs nothing but itself.
            let aborts = self.aborts;
            self.commit(consumer)?;
            if self.aborts != aborts || !self.takes(stage, p, offset) {
                return Ok(()); // rewound: it comes again in order
            }
        }
        if self.txn.is_none() {
            self.begin()?;
        }
        let record = Consumed::of(m, stage, self.cfg.repartition_topic.is_some());
        if m.topic() == self.cfg.topology.input_topic {
            self.metrics.records_in.inc();
        }
        let outcome = match (&verdict, stage) {
            (Verdict::DeadLetter(failures), _) => self.dead_letter_failed(&record, failures),
            (_, Stage::Route) => self.route_record(&record),
            (_, Stage::Dedup) => self.process_record(p, &record),
        };
        match stage {
            Stage::Route => {
                let route = self.routes.get_mut(&p).expect("route exists");
                route.position = Some(offset + 1);
                route.dirty = true;
            }
            Stage::Dedup => {
                let task = self.tasks.get_mut(&p).expect("task exists");
                task.position = Some(offset + 1);
                task.dirty = true;
            }
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

    fn stage_of(&self, topic: &str) -> Stage {
        if self.cfg.repartition_topic.is_some() && topic == self.cfg.topology.input_topic {
            Stage::Route
        } else {
            Stage::Dedup
        }
    }

    fn attempts_of(&mut self, stage: Stage) -> &mut RecordAttempts {
        match stage {
            Stage::Route => &mut self.route_attempts,
            Stage::Dedup => &mut self.attempts,
        }
    }

    /// Whether the record at `offset` is the next one of an active task (not one fetched
    /// before a rewind, a pause or a reassignment: those come again in order).
    fn takes(&self, stage: Stage, p: i32, offset: i64) -> bool {
        let next = |position: Option<i64>| position.is_none_or(|pos| offset >= pos);
        self.paused_until.is_none()
            && match stage {
                Stage::Route => self
                    .routes
                    .get(&p)
                    .is_some_and(|r| r.active && next(r.position)),
                Stage::Dedup => self
                    .tasks
                    .get(&p)
                    .is_some_and(|t| t.active() && next(t.position)),
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

    /// Sorts out records Kafka did not take: a topic that cannot be written stops the engine,
    /// a record's own failure counts against it, anything else is waited out. The transaction
    /// is aborted either way.
    pub(super) fn on_produce_errors(
        &mut self,
        consumer: &GroupConsumer,
        errors: Vec<ProduceError>,
    ) -> Result<(), EngineError> {
        let mut charged = false;
        let mut first = None;
        for e in &errors {
            let code = e.code.unwrap_or(RDKafkaErrorCode::Unknown);
            match classify_produce(code) {
                ProduceFailure::Topic => {
                    self.abort(consumer, &e.message);
                    return Err(EngineError::TopicUnusable {
                        topic: e.topic.clone(),
                        detail: e.message.clone(),
                    });
                }
                ProduceFailure::Record => {
                    if let Some(origin) = e.origin {
                        let too_large = matches!(
                            code,
                            RDKafkaErrorCode::MessageSizeTooLarge
                                | RDKafkaErrorCode::MessageBatchTooLarge
                        );
                        self.record_failed(
                            origin,
                            FailureKind::Produce,
                            e.message.clone(),
                            too_large,
                        );
                        charged = true;
                    }
                }
                ProduceFailure::Transient => {}
            }
            first.get_or_insert_with(|| e.message.clone());
        }
        self.abort(
            consumer,
            first.as_deref().unwrap_or("a record could not be produced"),
        );
        if !charged {
            // Nobody's fault: pause consumption a little, doubling while it lasts.
            let delay = (Duration::from_millis(100) * 2u32.pow(self.transient_aborts.min(6)))
                .min(Duration::from_secs(5));
            self.transient_aborts += 1;
            self.paused_until = Some(Instant::now() + delay);
            self.reassign(consumer);
        }
        Ok(())
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
            now_ms(),
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
        if self.cfg.topology.check_keying
            && record.key != Some(id.as_slice())
            && let Some(txn) = self.txn.as_mut()
        {
            txn.miskeyed += 1;
        }
        let origin = record.origin();
        let task = self.tasks.get_mut(&p).expect("task exists");
        let first_seen = match task.staged.puts.get(&id) {
            Some(t) => Some(*t),
            None => task
                .store
                .as_ref()
                .expect("an active task has its store")
                .first_seen(&id)
                .map_err(RecordError::Store)?,
        };
        if topology::is_duplicate(
            first_seen,
            record.time,
            self.cfg.topology.retention.as_millis() as i64,
        ) {
            self.metrics.duplicates.inc();
            if let Some(topic) = self.cfg.topology.duplicates_topic.clone() {
                let out = Outgoing {
                    topic: &topic,
                    partition: None,
                    key: record.key,
                    value: record.value,
                    headers: record.headers_with_id(&id),
                    timestamp: Some(record.time),
                };
                self.send(out, origin)?;
            }
            return Ok(());
        }
        // Not a duplicate. The store keeps the later of two first sightings: an out-of-order
        // record older than the store's by more than the retention leaves it as it is, so
        // every staged put is newer than what the store holds and the apply after the commit
        // need not read it again.
        let kept = topology::kept_sighting(first_seen, record.time);
        if kept == record.time {
            task.staged.put(&id, kept);
        }
        // The changelog says what the store keeps, not the record's own time: compaction
        // keeps only an id's last changelog record, and a store rebuilt from it (a new pod, a
        // standby, a quarantine) must decide as this one does.
        let changelog = self.cfg.changelog_topic.clone();
        self.send(
            Outgoing {
                topic: &changelog,
                partition: Some(p),
                key: Some(&id),
                value: Some(&kept.to_be_bytes()),
                headers: OwnedHeaders::new(),
                timestamp: None,
            },
            origin,
        )?;
        // The downstream `enrich` stage: the place where a failure after the put would leave
        // an aborted write in a store that applied writes eagerly.
        if self.faults.after_put(record.header(FAULT_HEADER)).is_err() {
            return Err(RecordError::Stage(
                "injected failure in the enrich stage".into(),
            ));
        }
        let output = self.cfg.topology.output_topic.clone();
        self.send(
            Outgoing {
                topic: &output,
                partition: None,
                key: record.key,
                value: record.value,
                headers: record.headers_with_id(&id),
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
        let topic = self.cfg.topology.dead_letter_topic.clone();
        let (key, value) = if metadata_only {
            (None, None)
        } else {
            (record.key, record.value)
        };
        self.send(
            Outgoing {
                topic: &topic,
                partition: None,
                key,
                value,
                headers,
                timestamp: None,
            },
            record.origin(),
        )?;
        if let Some(txn) = self.txn.as_mut() {
            txn.dead_letters.push(DeadLetterNote {
                at_ms: now_ms(),
                reason: reason.to_string(),
                source,
                detail: detail.to_string(),
            });
        }
        Ok(())
    }

    pub(super) fn send(&mut self, out: Outgoing<'_>, origin: Origin) -> Result<(), RecordError> {
        let topic = out.topic;
        let mut record: BaseRecord<'_, [u8], [u8], Box<Origin>> =
            BaseRecord::with_opaque_to(topic, Box::new(origin)).headers(out.headers);
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        if let Some(k) = out.key {
            record = record.key(k);
        }
        if let Some(v) = out.value {
            record = record.payload(v);
        }
        if let Some(t) = out.timestamp {
            record = record.timestamp(t);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(50));
                    self.shared.beat(self.cfg.thread);
                }
                Err((e, _)) => {
                    return Err(RecordError::Produce(ProduceError {
                        topic: topic.to_string(),
                        code: e.rdkafka_error_code(),
                        message: format!("producing to {topic}: {e}"),
                        origin: Some(origin),
                    }));
                }
            }
        }
    }

    pub(super) fn begin(&mut self) -> Result<(), EngineError> {
        match self.producer.begin_transaction() {
            Ok(()) => {
                self.txn = Some(OpenTxn {
                    started: Instant::now(),
                    dead_letters: Vec::new(),
                    miskeyed: 0,
                });
                Ok(())
            }
            Err(e) => Err(self.txn_error("begin_transaction", &e, None)),
        }
    }
}

/// A record to produce.
pub(super) struct Outgoing<'a> {
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: OwnedHeaders,
    /// The record's time (the input record's, carried to what is derived from it); `None`:
    /// the producer's clock.
    pub timestamp: Option<i64>,
}
