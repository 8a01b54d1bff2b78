//! Group membership: the consumer, its rebalance callbacks, and the consumer's local
//! assignment (only active tasks are consumed from).
//!
//! Rebalances are eager (classic protocol; the configuration refuses the incremental ones): a
//! revoke takes every partition, the assignment that follows gives the new set. Without
//! standbys the group is librdkafka's (range assignor, static membership) and its callbacks
//! feed the engine; with standbys it is the processor's own ([`super::state_aware_group`]),
//! whose generations feed the same two steps. Either way the steps only finish the open
//! transaction and feed lifecycle events; opening and restoring stores happens in the loop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{info, warn};

use super::{Engine, EngineConfig, EngineError, Task, default_property};
use crate::lifecycle::Event;

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
                let assigned: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect();
                let share = engine.share_of(&assigned);
                engine.on_assigned(consumer, share);
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

/// The engine's consumer buffer, unless the user's properties say otherwise; the changelog
/// reader of restores and standbys takes the same (and the benchmarks' transactional copy, so
/// that only the topology differs).
pub fn bound_consumer_buffer(client: &mut ClientConfig) {
    // Bounded buffers: the operator's memory budget counts on them. The bound counts the
    // records' bytes only; librdkafka keeps each record in an event of its own and its fetch
    // responses whole, so a full 16 MiB queue of 200-byte records held about 50 MiB. 4 MiB
    // (some 20,000 such records, a quarter second of one engine's work) keeps the engine fed
    // and took 45-50 MiB off the processor's peak memory (docs/performance.md).
    default_property(client, "queued.max.messages.kbytes", "4096");
    // When that buffer is full, librdkafka postpones each partition's next fetch by this long
    // (1 s by default). One engine drains the buffer in well under a second, so with the default
    // it ran dry and waited: bursts of processing between idle gaps of 0.5-2.5 s, and 56% of
    // the throughput it reaches with 10 ms (make bench-compare, docs/performance.md).
    default_property(client, "fetch.queue.backoff.ms", "10");
}

pub(super) fn new_consumer(
    cfg: &EngineConfig,
    engine: Arc<Mutex<Engine>>,
) -> Result<GroupConsumer, EngineError> {
    let mut client = cfg.client.clone();
    bound_consumer_buffer(&mut client);
    // With our own membership this consumer never joins the group (it is only assigned
    // partitions); the group id is for fetching the committed offsets.
    if cfg.group.standby_replicas == 0 {
        client.set("group.instance.id", cfg.member_id());
    }
    client
        .set("group.id", &cfg.application_id)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "range")
        .create_with_context(GroupContext { engine })
        .map_err(|e: KafkaError| EngineError::Fatal(format!("creating the consumer: {e}")))
}

/// What this process is given in one generation of the group.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Share {
    /// Dedup tasks to process.
    pub active: Vec<i32>,
    /// Dedup tasks to keep a warm copy of (standbys): `true` for a warm-up, a move here in
    /// progress.
    pub standby: BTreeMap<i32, bool>,
    /// Route tasks (input partitions of a repartitioning topology).
    pub routes: Vec<i32>,
}

impl Engine {
    /// librdkafka's assignment (topic, partition) as a share: the dedup topic's partitions are
    /// the dedup tasks, the input's (when repartitioning) the route tasks; no standbys.
    pub(super) fn share_of(&self, assigned: &[(String, i32)]) -> Share {
        let of = |topic: &str| -> Vec<i32> {
            assigned
                .iter()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect()
        };
        Share {
            active: of(self.cfg.dedup_input()),
            standby: BTreeMap::new(),
            routes: match self.cfg.repartition_topic {
                Some(_) => of(&self.cfg.topology.input_topic),
                None => Vec::new(),
            },
        }
    }

    /// The group's new assignment, after the revoke of the last one.
    pub(super) fn on_assigned(&mut self, consumer: &GroupConsumer, share: Share) {
        info!(active = ?share.active, standby = ?share.standby, routes = ?share.routes, "tasks assigned");
        self.assigned = true;
        self.routes.assign(&share.routes);
        // Stores of revoked tasks that did not come back, and standbys no longer kept here, are
        // closed now (with a checkpoint).
        let gone: Vec<i32> = self
            .dedup
            .tasks
            .keys()
            .copied()
            .filter(|p| !share.active.contains(p) && !share.standby.contains_key(p))
            .collect();
        for p in gone {
            self.on_task_event(p, Event::NotReassigned);
            self.forget_task(p);
            self.dedup.attempts.forget_partition(p);
        }
        for &p in &share.active {
            self.dedup.tasks.entry(p).or_insert_with(|| Task::new(p));
            self.on_task_event(p, Event::Assigned);
        }
        for (&p, &warm_up) in &share.standby {
            self.dedup.tasks.entry(p).or_insert_with(|| Task::new(p));
            self.on_task_event(p, Event::AssignedStandby { warm_up });
        }
        // Only active tasks are consumed from; the new ones join once restored.
        self.reassign(consumer);
        self.publish_tasks(true);
        self.refresh_readiness();
    }

    pub(super) fn on_revoked(&mut self, consumer: &GroupConsumer, lost: bool) {
        info!(lost, tasks = self.dedup.tasks.len(), "partitions revoked");
        if self.stopped {
            // Drained (stores closed) or stopped on an error: only let go.
            let _ = consumer.unassign();
            return;
        }
        if lost {
            self.abort(consumer, "assignment lost");
        } else if let Err(e) = self.commit(consumer) {
            self.pending_error = Some(e);
        }
        let partitions: Vec<i32> = self.dedup.tasks.keys().copied().collect();
        for p in partitions {
            self.on_task_event(p, Event::Revoked);
        }
        self.routes.revoke();
        let _ = consumer.unassign();
        self.assigned = false;
        self.faults.after_revoke();
        self.publish_tasks(true);
        self.refresh_readiness();
    }

    /// What an error the consumer reports means.
    pub fn on_consumer_error(
        &mut self,
        consumer: &GroupConsumer,
        err: KafkaError,
    ) -> Result<(), EngineError> {
        match err.rdkafka_error_code() {
            Some(RDKafkaErrorCode::FencedInstanceId) => {
                Err(self.after_instance_fenced(consumer, &err.to_string()))
            }
            Some(RDKafkaErrorCode::Fatal) => Err(EngineError::Fatal(format!("consumer: {err}"))),
            _ => {
                warn!(error = %err, "consumer error");
                Ok(())
            }
        }
    }

    /// Sets the consumer's local assignment to the active tasks (and route tasks), each at its
    /// position, and
    /// sets each one's pause flag: paused while transient produce failures back off, resumed
    /// otherwise. librdkafka keeps a partition's pause flag across assignments, even across a
    /// revoke and a new assignment of the same partition, so a partition paused before a
    /// rebalance and active again only after the pause ended would stay paused for good unless
    /// every assignment says which it is.
    pub(super) fn reassign(&mut self, consumer: &GroupConsumer) {
        let mut tpl = TopicPartitionList::new();
        for (p, next) in self.dedup.consumed() {
            let offset = next.map_or(Offset::Beginning, Offset::Offset);
            tpl.add_partition_offset(self.cfg.dedup_input(), p, offset)
                .expect("valid partition");
        }
        for (p, next) in self.routes.consumed() {
            let offset = next.map_or(Offset::Beginning, Offset::Offset);
            tpl.add_partition_offset(&self.cfg.topology.input_topic, p, offset)
                .expect("valid partition");
        }
        if let Err(e) = consumer.assign(&tpl) {
            self.pending_error = Some(EngineError::Fatal(format!("assigning partitions: {e}")));
            return;
        }
        if tpl.count() == 0 {
            return;
        }
        let flagged = if self.paused_until.is_some() {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if let Err(e) = flagged {
            warn!(error = %e, paused = self.paused_until.is_some(), "could not set the partitions' pause flag");
        }
    }

    /// Moves the active tasks (and route tasks) back to their committed positions after an
    /// abort.
    pub(super) fn rewind(&mut self, consumer: &GroupConsumer) {
        self.routes.rewind();
        for (p, committed) in self.dedup.rewind() {
            let offset = committed.map_or(Offset::Beginning, Offset::Offset);
            if let Err(e) =
                consumer.seek(self.cfg.dedup_input(), p, offset, Duration::from_secs(10))
            {
                warn!(partition = p, error = %e, "seek after abort failed; reassigning");
            }
        }
        // Reassigning with the committed positions rewinds even where a seek failed.
        self.reassign(consumer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consumer_buffer_is_bounded_to_4_mib_unless_the_user_says_otherwise() {
        let mut client = ClientConfig::new();
        bound_consumer_buffer(&mut client);
        assert_eq!(client.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(client.get("fetch.queue.backoff.ms"), Some("10"));

        let mut client = ClientConfig::new();
        client.set("queued.max.messages.kbytes", "65536");
        bound_consumer_buffer(&mut client);
        assert_eq!(client.get("queued.max.messages.kbytes"), Some("65536"));
    }
}
