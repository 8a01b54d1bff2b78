//! How the engine ends a transaction: it asks the stages which offsets to commit, has the
//! [`Transaction`](super::transaction::Transaction) commit them, and tells the stages what
//! came of it — committed (the dedup stage's staged writes reach the stores) or aborted
//! (both stages rewind). Also what a failed commit or a refused record leads to: an abort, a
//! pause of consumption while Kafka is away, a new producer, or the end of the engine.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use streamapp_api::health::DeadLetterNote;
use tracing::{debug, warn};

use super::delivery::ProduceError;
use super::transaction::{CommitOutcome, Committed, OffsetsFence};
use super::{Engine, EngineError, GroupConsumer};
use crate::kafka_errors::{ProduceFailure, TxnFailure, classify_produce};
use crate::lifecycle::Event;
use crate::record_attempts::FailureKind;

/// The pause of consumption after `transient_aborts` aborts in a row that nobody's record
/// caused (Kafka away for a while): 100 ms, doubling, at most 5 s.
pub(super) fn transient_pause(transient_aborts: u32) -> Duration {
    (Duration::from_millis(100) * 2u32.pow(transient_aborts.min(6))).min(Duration::from_secs(5))
}

impl Engine {
    /// Commits the open transaction: asks the stages for their offsets, commits them with
    /// the records, and tells the stages. Abortable errors abort instead (writes dropped,
    /// consumer rewound); only errors that end the engine are returned.
    pub fn commit(&mut self, consumer: &GroupConsumer) -> Result<(), EngineError> {
        if !self.txn.is_open() {
            return Ok(());
        }
        let mut positions = TopicPartitionList::new();
        for (p, offset) in self.dedup.to_commit() {
            positions
                .add_partition_offset(self.cfg.dedup_input(), p, Offset::Offset(offset))
                .expect("valid");
        }
        for (p, offset) in self.routes.to_commit() {
            positions
                .add_partition_offset(&self.cfg.topology.input_topic, p, Offset::Offset(offset))
                .expect("valid");
        }
        // The offsets go with the group's metadata, which fences a zombie of an older
        // generation (KIP-447): librdkafka's, or the generation of our own membership.
        let fence = match &self.own_group {
            Some(group) => group.generation().cloned().map(OffsetsFence::Generation),
            None => consumer.group_metadata().map(OffsetsFence::Consumer),
        };
        match self.txn.commit(&positions, fence, &mut self.faults) {
            CommitOutcome::NothingOpen => Ok(()),
            CommitOutcome::Committed(committed) => {
                self.after_commit(committed);
                Ok(())
            }
            CommitOutcome::ProduceFailed(failures) => self.on_produce_errors(consumer, failures),
            CommitOutcome::Failed(failure) => self.on_txn_failure(consumer, "commit", failure),
        }
    }

    /// Tells the stages and the health report that the transaction committed.
    fn after_commit(&mut self, committed: Committed) {
        let applying = Instant::now();
        self.transient_aborts = 0;
        self.faults.after_commit();
        let failed = self.dedup.committed(&committed.changelog_offsets);
        self.routes.committed();
        self.count_dead_letters(committed.dead_letters);
        if committed.miskeyed > 0 {
            self.metrics.miskeyed_records.inc_by(committed.miskeyed);
            self.shared
                .update(false, |h| h.miskeyed_records += committed.miskeyed);
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
        debug!(
            apply_us = applying.elapsed().as_micros() as u64,
            "committed writes handed to the stores"
        );
    }

    fn count_dead_letters(&mut self, notes: Vec<DeadLetterNote>) {
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
            TxnFailure::TimedOut(why) => {
                // The coordinator aborted it: its work is dropped as by an abort.
                let replaced = self.txn.end_timed_out(&why);
                self.rewind(consumer);
                replaced
            }
            TxnFailure::Fenced(detail) => Err(self.txn.fenced(detail)),
            TxnFailure::Fatal(d) => Err(EngineError::Fatal(format!("{what}: {d}"))),
        }
    }

    /// Aborts the open transaction: staged writes are dropped and the consumer goes back to
    /// the committed positions, so the records are processed again. An abort that leaves the
    /// engine unable to go on is returned by the next `tick`.
    pub(super) fn abort(&mut self, consumer: &GroupConsumer, why: &str) {
        let Some(aborted) = self.txn.abort(why) else {
            return;
        };
        self.rewind(consumer);
        if let Err(e) = aborted {
            self.pending_error = Some(e);
        }
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
            self.paused_until = Some(Instant::now() + transient_pause(self.transient_aborts));
            self.transient_aborts += 1;
            self.reassign(consumer);
        }
        Ok(())
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
        match self.txn.probe() {
            Err(TxnFailure::Fenced(producer)) => self.txn.fenced(format!(
                "the group fenced this pod's group.instance.id ({detail}) and the producer is fenced too ({producer})"
            )),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_after_transient_failures_doubles_from_100_ms_up_to_5_s() {
        let pauses: Vec<u128> = (0..9).map(|n| transient_pause(n).as_millis()).collect();
        assert_eq!(
            pauses,
            vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]
        );
    }
}
