//! The route stage's state: one task per input partition this member owns, each with its
//! place in the input ([`TaskPosition`]) and no store, and the failed attempts of its
//! records. What the stage makes of one record is [`route`]: a pure function from the record
//! and its id to the repartition record; the engine sends it inside the open transaction.

use std::collections::BTreeMap;

use rdkafka::message::{Header, OwnedHeaders};

use super::{KEY_HEADER, SOURCE_HEADER, partition_for};
use crate::record_attempts::RecordAttempts;
use crate::task_position::TaskPosition;

/// A task of the route stage: one input partition whose records go to the repartition topic.
/// It has no state, so it is consumed from as soon as its committed offset is known.
#[derive(Debug, Default)]
struct RouteTask {
    /// Its committed offset was fetched and the consumer reads it.
    active: bool,
    position: TaskPosition,
}

/// The route stage's tasks and its records' failed attempts (their offsets are input offsets).
#[derive(Debug)]
pub struct RouteStage {
    tasks: BTreeMap<i32, RouteTask>,
    attempts: RecordAttempts,
    max_record_attempts: u32,
}

impl RouteStage {
    pub fn new(max_record_attempts: u32) -> Self {
        RouteStage {
            tasks: BTreeMap::new(),
            attempts: RecordAttempts::new(max_record_attempts),
            max_record_attempts,
        }
    }

    /// The group's new assignment: these input partitions, none of them active until its
    /// committed offset is known ([`RouteStage::activate`]).
    pub fn assign(&mut self, partitions: &[i32]) {
        self.tasks = partitions
            .iter()
            .map(|&p| (p, RouteTask::default()))
            .collect();
    }

    /// The assignment was revoked: no task, and no failed attempt is remembered (the next
    /// owner counts them again).
    pub fn revoke(&mut self) {
        self.tasks.clear();
        self.attempts = RecordAttempts::new(self.max_record_attempts);
    }

    /// The engine drains: it routes nothing more.
    pub fn stop(&mut self) {
        self.tasks.clear();
    }

    /// Partitions waiting for their committed offset.
    pub fn waiting(&self) -> Vec<i32> {
        self.tasks
            .iter()
            .filter(|(_, t)| !t.active)
            .map(|(&p, _)| p)
            .collect()
    }

    /// Partition `p` is consumed from its committed offset on.
    pub fn activate(&mut self, p: i32, committed: Option<i64>) {
        if let Some(task) = self.tasks.get_mut(&p) {
            task.active = true;
            task.position = TaskPosition::starting_at(committed);
        }
    }

    /// Whether the record at `offset` of input partition `p` is the next one of an active task.
    pub fn takes(&self, p: i32, offset: i64) -> bool {
        self.tasks
            .get(&p)
            .is_some_and(|t| t.active && t.position.takes(offset))
    }

    /// The record at `offset` of partition `p` was routed in the open transaction.
    pub fn processed(&mut self, p: i32, offset: i64) {
        if let Some(task) = self.tasks.get_mut(&p) {
            task.position.processed(offset);
        }
    }

    pub fn attempts(&mut self) -> &mut RecordAttempts {
        &mut self.attempts
    }

    /// The active tasks and where the consumer reads each.
    pub fn consumed(&self) -> impl Iterator<Item = (i32, Option<i64>)> + '_ {
        self.tasks
            .iter()
            .filter(|(_, t)| t.active)
            .map(|(&p, t)| (p, t.position.next()))
    }

    /// Every task and its next offset, for the lag report.
    pub fn positions(&self) -> impl Iterator<Item = (i32, Option<i64>)> + '_ {
        self.tasks.iter().map(|(&p, t)| (p, t.position.next()))
    }

    /// The input offsets to commit with the open transaction.
    pub fn to_commit(&self) -> impl Iterator<Item = (i32, i64)> + '_ {
        self.tasks
            .iter()
            .filter_map(|(&p, t)| Some((p, t.position.to_commit()?)))
    }

    /// The open transaction committed.
    pub fn committed(&mut self) {
        for (&p, task) in &mut self.tasks {
            if let Some(offset) = task.position.commit() {
                self.attempts.committed(p, offset);
            }
        }
    }

    /// The open transaction aborted: every task goes back to its committed offset.
    pub fn rewind(&mut self) {
        for task in self.tasks.values_mut() {
            task.position.rewind();
        }
    }
}

/// The repartition record of an input record: keyed by its dedup `id`, on the partition of
/// that id among the repartition topic's `partitions`, carrying the input record's key and
/// source (`topic/partition/offset`) in headers after its own.
pub fn route(
    id: &[u8],
    key: Option<&[u8]>,
    source: &str,
    headers: OwnedHeaders,
    partitions: u32,
) -> (i32, OwnedHeaders) {
    let headers = headers
        .insert(Header {
            key: KEY_HEADER,
            value: key,
        })
        .insert(Header {
            key: SOURCE_HEADER,
            value: Some(source),
        });
    (partition_for(id, partitions), headers)
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;

    use super::*;

    #[test]
    fn a_task_takes_records_only_once_active_and_from_its_committed_offset() {
        let mut stage = RouteStage::new(3);
        stage.assign(&[0, 1]);
        assert_eq!(stage.waiting(), vec![0, 1]);
        assert!(!stage.takes(0, 5), "not active yet");
        stage.activate(0, Some(5));
        assert_eq!(stage.waiting(), vec![1]);
        assert!(!stage.takes(0, 4));
        assert!(stage.takes(0, 5));
        assert!(!stage.takes(2, 0), "not assigned here");
        assert_eq!(stage.consumed().collect::<Vec<_>>(), vec![(0, Some(5))]);
    }

    #[test]
    fn commit_asks_only_tasks_that_moved_and_an_abort_rewinds_them() {
        let mut stage = RouteStage::new(3);
        stage.assign(&[0, 1]);
        stage.activate(0, Some(5));
        stage.activate(1, None);
        stage.processed(0, 5);
        stage.processed(0, 6);
        assert_eq!(stage.to_commit().collect::<Vec<_>>(), vec![(0, 7)]);
        stage.committed();
        assert_eq!(stage.to_commit().count(), 0);
        stage.processed(0, 7);
        stage.rewind();
        assert_eq!(
            stage.consumed().collect::<Vec<_>>(),
            vec![(0, Some(7)), (1, None)]
        );
        assert!(stage.takes(0, 7), "the aborted record comes again");
    }

    #[test]
    fn failed_attempts_are_forgotten_once_committed_past_and_on_a_revoke() {
        use crate::record_attempts::{FailureKind, Verdict};
        let mut stage = RouteStage::new(3);
        stage.assign(&[0]);
        stage.activate(0, Some(0));
        stage
            .attempts()
            .failed(0, 0, FailureKind::Produce, "refused".into(), false);
        assert_ne!(stage.attempts().verdict(0, 0), Verdict::Process);
        stage.revoke();
        assert_eq!(stage.attempts().verdict(0, 0), Verdict::Process);
        assert!(stage.waiting().is_empty(), "no task after a revoke");
    }

    #[test]
    fn a_routed_record_is_keyed_by_its_id_and_carries_its_key_and_source() {
        let (partition, headers) = route(
            b"order-1",
            Some(b"customer-7"),
            "in/3/42",
            OwnedHeaders::new(),
            12,
        );
        assert_eq!(partition, partition_for(b"order-1", 12));
        let found: Vec<(String, Option<Vec<u8>>)> = headers
            .iter()
            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(
            found,
            vec![
                (KEY_HEADER.to_string(), Some(b"customer-7".to_vec())),
                (SOURCE_HEADER.to_string(), Some(b"in/3/42".to_vec())),
            ]
        );
    }
}
