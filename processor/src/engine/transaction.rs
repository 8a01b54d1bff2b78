//! The Kafka transaction: the producer, commit (and only then the store apply), abort, and what
//! a failed transactional call means ([`crate::kafka_errors::classify_txn`]).
//!
//! A transaction the coordinator aborted on `transaction.timeout.ms` makes librdkafka report
//! the producer as fenced; when our own transaction is that old, nobody else took over: the
//! engine drops the transaction's work, creates a new producer and goes on, instead of exiting
//! as a fenced instance would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, warn};

use super::delivery::{DeliveryTracker, await_deliveries};
use super::{
    DEFAULT_TRANSACTION_TIMEOUT, Engine, EngineConfig, EngineError, GroupConsumer,
    TXN_CALL_TIMEOUT, TXN_DEADLINE, default_property,
};
use crate::group::txn_offsets::{GroupGeneration, send_offsets_to_transaction};
use crate::kafka_errors::{TxnErrorFacts, TxnFailure, classify_commit, classify_txn, is_retriable};
use crate::lifecycle::Event;
use crate::shared::Shared;
use crate::txn_coordinator::{CoordinatorClient, FenceOrigin, fence_origin};

/// Creates the transactional producer and initialises its transactions, which aborts what a
/// previous incarnation left open and fences it.
pub(super) fn new_producer(
    cfg: &EngineConfig,
    shared: &Arc<Shared>,
) -> Result<BaseProducer<DeliveryTracker>, EngineError> {
    let mut client = cfg.client.clone();
    default_property(&mut client, "linger.ms", "5");
    // Bounded buffers: the operator's memory budget counts on them.
    default_property(&mut client, "queue.buffering.max.kbytes", "65536");
    default_property(
        &mut client,
        "transaction.timeout.ms",
        &DEFAULT_TRANSACTION_TIMEOUT.as_millis().to_string(),
    );
    let producer: BaseProducer<DeliveryTracker> = client
        .set("transactional.id", cfg.transactional_id())
        .set("enable.idempotence", "true")
        .create_with_context(DeliveryTracker::new(&cfg.changelog_topic))
        .map_err(|e| EngineError::Fatal(format!("creating the producer: {e}")))?;
    retry_txn(shared, cfg.thread, || {
        producer.init_transactions(TXN_CALL_TIMEOUT)
    })
    .map_err(|e| {
        match classify_txn(&TxnErrorFacts::of(&e), None, cfg.transaction_timeout()) {
            TxnFailure::Fenced(detail) => EngineError::Fenced {
                transactional_id: cfg.transactional_id(),
                detail,
            },
            TxnFailure::Abortable(d) | TxnFailure::TimedOut(d) | TxnFailure::Fatal(d) => {
                EngineError::Fatal(format!("init_transactions: {d}"))
            }
        }
    })?;
    Ok(producer)
}

/// Calls a transactional function until it succeeds or fails for a reason other than a
/// retriable one (timeouts included: the operation continues in the background and calling
/// again is how to wait for it). Each retry counts as progress of the loop.
fn retry_txn(
    shared: &Shared,
    thread: usize,
    mut f: impl FnMut() -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + TXN_DEADLINE;
    loop {
        shared.beat(thread);
        match f() {
            Ok(()) => return Ok(()),
            Err(e) if is_retriable(&e) && Instant::now() < deadline => {
                debug!(error = %e, "retriable transactional error; retrying");
            }
            Err(e) => return Err(e),
        }
    }
}

/// What fences the transaction's offsets.
enum OffsetsFence {
    /// librdkafka's group membership: its metadata.
    Consumer(rdkafka::consumer::ConsumerGroupMetadata),
    /// The processor's own membership: the member id and generation of its current share.
    Generation(GroupGeneration),
}

/// Sends the offsets with our own membership's generation, retrying what librdkafka calls
/// retriable (as [`retry_txn`] does). A stale generation is refused: an abortable error.
fn send_offsets_with_generation<C: rdkafka::producer::ProducerContext>(
    shared: &Shared,
    thread: usize,
    producer: &BaseProducer<C>,
    positions: &TopicPartitionList,
    generation: &GroupGeneration,
) -> Result<(), TxnErrorFacts> {
    let deadline = Instant::now() + TXN_DEADLINE;
    loop {
        shared.beat(thread);
        match send_offsets_to_transaction(producer, positions, generation, TXN_CALL_TIMEOUT) {
            Ok(()) => return Ok(()),
            Err(e) if e.retriable && Instant::now() < deadline => {
                debug!(error = %e, "retriable error sending the offsets; retrying");
            }
            Err(e) => return Err(e.facts),
        }
    }
}

impl Engine {
    /// The error a failed transactional call ends the engine with (or `Fatal` for an abortable
    /// one where aborting is not possible, such as `begin_transaction`).
    pub(super) fn txn_error(
        &self,
        what: &str,
        e: &KafkaError,
        txn_age: Option<Duration>,
    ) -> EngineError {
        match classify_txn(
            &TxnErrorFacts::of(e),
            txn_age,
            self.cfg.transaction_timeout(),
        ) {
            TxnFailure::Fenced(detail) => EngineError::Fenced {
                transactional_id: self.cfg.transactional_id(),
                detail,
            },
            TxnFailure::Abortable(d) | TxnFailure::TimedOut(d) | TxnFailure::Fatal(d) => {
                EngineError::Fatal(format!("{what}: {d}"))
            }
        }
    }

    /// Commits the open transaction and applies its writes to the stores. Abortable errors
    /// abort instead (writes dropped, consumer rewound); only errors that end the engine are
    /// returned.
    pub fn commit(&mut self, consumer: &GroupConsumer) -> Result<(), EngineError> {
        let Some(txn) = &self.txn else {
            return Ok(());
        };
        let started = txn.started;
        let commit_start = Instant::now();
        let failures = self.producer.context().take_failures();
        if !failures.is_empty() {
            return self.on_produce_errors(consumer, failures);
        }
        let mut positions = TopicPartitionList::new();
        for task in self.tasks.values().filter(|t| t.dirty) {
            if let Some(pos) = task.position {
                positions
                    .add_partition_offset(
                        self.cfg.dedup_input(),
                        task.partition,
                        Offset::Offset(pos),
                    )
                    .expect("valid");
            }
        }
        for (&p, route) in self.routes.iter().filter(|(_, r)| r.dirty) {
            if let Some(pos) = route.position {
                positions
                    .add_partition_offset(&self.cfg.topology.input_topic, p, Offset::Offset(pos))
                    .expect("valid");
            }
        }
        // The offsets go with the group's metadata, which fences a zombie of an older
        // generation (KIP-447): librdkafka's, or the generation of our own membership.
        let fence = match &self.own_group {
            Some(group) => group.generation().cloned().map(OffsetsFence::Generation),
            None => consumer.group_metadata().map(OffsetsFence::Consumer),
        };
        let Some(fence) = fence else {
            self.abort(consumer, "no consumer group metadata");
            return Ok(());
        };
        await_deliveries(&self.producer, TXN_CALL_TIMEOUT);
        let delivered = commit_start.elapsed();
        let failures = self.producer.context().take_failures();
        if !failures.is_empty() {
            return self.on_produce_errors(consumer, failures);
        }
        let shared = self.shared.clone();
        let sent = match &fence {
            OffsetsFence::Consumer(group) => retry_txn(&shared, self.cfg.thread, || {
                self.producer
                    .send_offsets_to_transaction(&positions, group, TXN_CALL_TIMEOUT)
            })
            .map_err(|e| TxnErrorFacts::of(&e)),
            OffsetsFence::Generation(generation) => send_offsets_with_generation(
                &shared,
                self.cfg.thread,
                &self.producer,
                &positions,
                generation,
            ),
        };
        let offsets_sent = commit_start.elapsed();
        if sent.is_ok() {
            self.faults.before_commit();
        }
        // (facts, whether the commit itself was still retriable when retries stopped)
        let committed = sent.map_err(|facts| (facts, false)).and_then(|()| {
            retry_txn(&shared, self.cfg.thread, || {
                self.producer.commit_transaction(TXN_CALL_TIMEOUT)
            })
            .map_err(|e| (TxnErrorFacts::of(&e), is_retriable(&e)))
        });
        if let Err((facts, retriable)) = committed {
            let failure = classify_commit(
                &facts,
                retriable,
                started.elapsed(),
                self.cfg.transaction_timeout(),
            );
            // A record Kafka refused dooms the transaction: charge it to that record. Not when
            // the commit's outcome is unknown: it may have committed, and nothing is aborted.
            let failures = self.producer.context().take_failures();
            if !retriable && !failures.is_empty() {
                return self.on_produce_errors(consumer, failures);
            }
            return self.on_txn_failure(consumer, "commit", failure);
        }
        let ended = commit_start.elapsed();
        let txn = self.txn.take().expect("open");
        self.metrics.transactions_committed.inc();
        self.transient_aborts = 0;
        self.faults.after_commit();
        // Committed: now, and only now, the staged writes reach the stores.
        let changelog_offsets = self.producer.context().take_offsets();
        let mut failed = Vec::new();
        for task in self.tasks.values_mut().filter(|t| t.dirty) {
            task.staged.changelog_offset = changelog_offsets.get(&task.partition).map(|o| o + 1);
            if task.staged.changelog_offset.is_some() {
                task.at_commit_marker = true;
            }
            task.staged.input_offset = task.position;
            // Written on a thread of the store's own while the next transaction is processed.
            let staged = std::mem::take(&mut task.staged);
            if let Some(store) = task.store.as_mut()
                && let Err(e) = store.apply_decided(staged)
            {
                // The data is safe in the changelog: the store catches up from it.
                failed.push((task.partition, e));
            }
            task.committed = task.position;
            task.dirty = false;
            task.health.committed_offset = task.committed;
            if let Some(store) = &task.store {
                task.health.store_changelog_offset = store.meta().changelog_offset;
            }
            task.health.last_checkpoint_at_ms = Some(crate::shared::now_ms());
            if let Some(pos) = task.position {
                self.attempts.committed(task.partition, pos);
            }
        }
        for (&p, route) in self.routes.iter_mut().filter(|(_, r)| r.dirty) {
            route.committed = route.position;
            route.dirty = false;
            if let Some(pos) = route.position {
                self.route_attempts.committed(p, pos);
            }
        }
        self.count_dead_letters(txn.dead_letters);
        if txn.miskeyed > 0 {
            self.metrics.miskeyed_records.inc_by(txn.miskeyed);
            self.shared
                .update(false, |h| h.miskeyed_records += txn.miskeyed);
        }
        for (p, e) in failed {
            self.on_task_event(
                p,
                Event::StoreFailed {
                    fault: e.fault(),
                    reason: e.reason().to_string(),
                },
            );
        }
        self.metrics
            .commit_seconds
            .observe(commit_start.elapsed().as_secs_f64());
        debug!(
            txn_ms = started.elapsed().as_millis() as u64,
            deliveries_us = delivered.as_micros() as u64,
            offsets_us = (offsets_sent - delivered).as_micros() as u64,
            end_us = (ended - offsets_sent).as_micros() as u64,
            apply_us = (commit_start.elapsed() - ended).as_micros() as u64,
            "transaction committed"
        );
        Ok(())
    }

    fn count_dead_letters(&mut self, notes: Vec<streamapp_api::health::DeadLetterNote>) {
        if notes.is_empty() {
            return;
        }
        for note in &notes {
            self.metrics
                .dead_letters
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: note.reason.clone(),
                })
                .inc();
        }
        self.shared.update(true, |h| {
            for note in &notes {
                *h.dead_letters.entry(note.reason.clone()).or_default() += 1;
            }
            h.last_dead_letter = notes.last().cloned();
        });
    }

    /// What a failed commit leads to.
    fn on_txn_failure(
        &mut self,
        consumer: &GroupConsumer,
        what: &str,
        failure: TxnFailure,
    ) -> Result<(), EngineError> {
        match failure {
            TxnFailure::Abortable(why) => {
                self.abort(consumer, &why);
                Ok(())
            }
            TxnFailure::TimedOut(why) => self.recover_from_timeout(consumer, &why),
            TxnFailure::Fenced(detail) => Err(EngineError::Fenced {
                transactional_id: self.cfg.transactional_id(),
                detail,
            }),
            TxnFailure::Fatal(d) => Err(EngineError::Fatal(format!("{what}: {d}"))),
        }
    }

    /// Aborts the open transaction: staged writes are dropped and the consumer goes back to
    /// the committed positions, so the records are processed again.
    pub(super) fn abort(&mut self, consumer: &GroupConsumer, why: &str) {
        let Some(txn) = self.txn.take() else {
            return;
        };
        warn!(reason = why, "aborting the transaction");
        self.metrics.transactions_aborted.inc();
        // librdkafka waits for the delivery reports of the aborted records, and a BaseProducer
        // only serves them when polled: flush serves them (the records are aborted anyway).
        let _ = self.producer.flush(TXN_CALL_TIMEOUT);
        let shared = self.shared.clone();
        let aborted = retry_txn(&shared, self.cfg.thread, || {
            self.producer.poll(Duration::ZERO);
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        });
        self.producer.context().clear();
        self.aborts += 1;
        self.rewind(consumer);
        if let Err(e) = aborted {
            // The transaction is gone either way; what matters is whether we may go on.
            let age = txn.started.elapsed();
            match classify_txn(
                &TxnErrorFacts::of(&e),
                Some(age),
                self.cfg.transaction_timeout(),
            ) {
                TxnFailure::TimedOut(why) => {
                    if let Err(e) = self.replace_producer(&why) {
                        self.pending_error = Some(e);
                    }
                }
                TxnFailure::Fenced(detail) => {
                    self.pending_error = Some(EngineError::Fenced {
                        transactional_id: self.cfg.transactional_id(),
                        detail,
                    });
                }
                TxnFailure::Abortable(d) | TxnFailure::Fatal(d) => {
                    self.pending_error = Some(EngineError::Fatal(format!("abort: {d}")));
                }
            }
        }
    }

    /// The group coordinator fenced this pod's `group.instance.id`. That is another instance
    /// of the pod only if it fenced our producer too: an engine initialises its transactions
    /// (fencing older producers of its `transactional.id`) before it joins the group. So one
    /// probe transaction tells: fenced as well, another instance took over and this one stops;
    /// not, the coordinator lost track of our membership (as after its own crash) and the
    /// engine starts again and rejoins.
    pub(super) fn after_instance_fenced(
        &mut self,
        consumer: &GroupConsumer,
        detail: &str,
    ) -> EngineError {
        self.abort(consumer, "the consumer's group membership was fenced");
        if let Some(e @ EngineError::Fenced { .. }) = self.pending_error.take() {
            return e;
        }
        match self.probe_transaction() {
            Err(TxnFailure::Fenced(producer)) => EngineError::Fenced {
                transactional_id: self.cfg.transactional_id(),
                detail: format!(
                    "the group fenced this pod's group.instance.id ({detail}) and the producer is fenced too ({producer})"
                ),
            },
            probe => {
                warn!(
                    ?probe,
                    detail,
                    "the group fenced this pod's group.instance.id, but no other instance holds its transactional.id: rejoining"
                );
                EngineError::Fatal(format!(
                    "the group coordinator fenced group.instance.id {} without another instance holding transactional.id {} ({detail}): starting again",
                    self.cfg.member_id(),
                    self.cfg.transactional_id()
                ))
            }
        }
    }

    /// A transaction with one record to the changelog, aborted: a round trip to the
    /// transaction coordinator with our producer epoch, visible to no read_committed reader.
    /// A producer librdkafka already holds for fenced fails it at once.
    fn probe_transaction(&mut self) -> Result<(), TxnFailure> {
        let timeout = self.cfg.transaction_timeout();
        let fatal = |producer: &BaseProducer<DeliveryTracker>| {
            producer.client().fatal_error().map(|(code, message)| {
                classify_txn(
                    &TxnErrorFacts {
                        code: Some(code),
                        fatal: true,
                        message,
                    },
                    None,
                    timeout,
                )
            })
        };
        if let Some(failure) = fatal(&self.producer) {
            return Err(failure);
        }
        let result = self.probe_round_trip();
        match (result, fatal(&self.producer)) {
            (Err(_), Some(failure)) => Err(failure),
            (result, _) => result,
        }
    }

    fn probe_round_trip(&mut self) -> Result<(), TxnFailure> {
        let timeout = self.cfg.transaction_timeout();
        let fail = |e: &KafkaError| classify_txn(&TxnErrorFacts::of(e), None, timeout);
        self.producer.begin_transaction().map_err(|e| fail(&e))?;
        let record: rdkafka::producer::BaseRecord<'_, [u8], [u8], Box<super::Origin>> =
            rdkafka::producer::BaseRecord::with_opaque_to(
                &self.cfg.changelog_topic,
                Box::new(super::Origin {
                    stage: super::Stage::Dedup,
                    partition: -1,
                    offset: -1,
                }),
            )
            .partition(0)
            .key(b"streamapp.fence-probe".as_slice());
        if let Err((e, _)) = self.producer.send(record) {
            let _ = self.producer.abort_transaction(TXN_CALL_TIMEOUT);
            return Err(fail(&e));
        }
        await_deliveries(&self.producer, TXN_CALL_TIMEOUT);
        let shared = self.shared.clone();
        let aborted = retry_txn(&shared, self.cfg.thread, || {
            self.producer.poll(Duration::ZERO);
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        });
        self.producer.context().clear();
        aborted.map_err(|e| fail(&e))
    }

    /// The coordinator aborted our transaction on its timeout: drop its work, rewind, and go
    /// on with a new producer.
    fn recover_from_timeout(
        &mut self,
        consumer: &GroupConsumer,
        why: &str,
    ) -> Result<(), EngineError> {
        self.txn = None;
        self.metrics.transactions_aborted.inc();
        self.aborts += 1;
        self.rewind(consumer);
        self.replace_producer(why)
    }

    /// A fence on a transaction older than its timeout: a new producer, unless the
    /// transaction coordinator shows that another instance of this pod took the
    /// transactional id over (this one is then the zombie, and a new producer would fence the
    /// live instance).
    fn replace_producer(&mut self, why: &str) -> Result<(), EngineError> {
        let transactional_id = self.cfg.transactional_id();
        match self.ask_coordinator(&transactional_id) {
            Ok(FenceOrigin::AnotherInstance { state }) => {
                return Err(EngineError::Fenced {
                    transactional_id: transactional_id.clone(),
                    detail: format!(
                        "{why}; the transaction coordinator shows {transactional_id} in state \
                         {state}, not the abort of this transaction: another instance of this \
                         pod took it over"
                    ),
                });
            }
            Ok(FenceOrigin::Timeout) => {}
            Err(e) => warn!(error = %e,
                "could not ask the transaction coordinator who ended the transaction; taking it for its timeout"),
        }
        warn!(
            reason = why,
            timeout_ms = self.cfg.transaction_timeout().as_millis() as u64,
            "the transaction outlived transaction.timeout.ms and the coordinator aborted it \
             (not a fence by another instance): its records are processed again with a new producer"
        );
        self.metrics.transaction_timeouts.inc();
        self.producer = new_producer(&self.cfg, &self.shared)?;
        Ok(())
    }

    fn ask_coordinator(&self, transactional_id: &str) -> Result<FenceOrigin, String> {
        self.shared.beat(self.cfg.thread);
        let state = CoordinatorClient::from_client(
            &self.cfg.client,
            format!("{transactional_id}-describe"),
            TXN_CALL_TIMEOUT,
        )?
        .transaction_state(transactional_id)?;
        Ok(fence_origin(&state))
    }
}
