//! The transaction doctor's decisions: which partitions are stuck behind an open transaction,
//! whether that transaction is *hanging* (open on the partition, but no transaction coordinator
//! will ever end it: Kafka's KIP-664 problem) or only slow, and whether the operator may end it.
//!
//! Pure functions on plain values, each a unit test; the operator reads the offsets, the
//! partition leaders' producer states and the coordinators' transactions, and acts on the
//! answers. Why it is safe: Kafka fences a producer by its transactional id and epoch, so
//! writing an abort marker for a producer that is no longer any live transactional id of this
//! app can only end what nobody will ever end; it is done only on the app's own internal topics
//! (the repartition topic and the changelog), where only its processors write, unless the user
//! opts in for the others.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use streamapp_api::config::{
    changelog_topic, group_member, repartition_topic, transaction_timeout, transactional_id,
};
use streamapp_api::crd::{AbortHangingTransactions, StreamApp};

use crate::processor_config::application_id;

pub mod kafka;

/// A topic and a partition.
pub type TopicPartition = (String, i32);

/// A partition's last stable offset (what read_committed readers may read up to) and its end
/// (high watermark).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub stable: i64,
    pub end: i64,
}

/// Since when each partition's last stable offset has stood still behind its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StuckSince(BTreeMap<TopicPartition, (i64, Timestamp)>);

/// A partition stuck for at least the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    pub partition: TopicPartition,
    /// Where read_committed readers stop.
    pub stable: i64,
    pub stuck_for: Duration,
}

impl StuckSince {
    /// The next look: a partition whose last stable offset is behind its end and has not moved
    /// keeps its time; one that moved (or newly fell behind) starts now; one caught up is
    /// forgotten, and so is one not read this time.
    pub fn observe(&self, offsets: &BTreeMap<TopicPartition, Offsets>, now: Timestamp) -> Self {
        StuckSince(
            offsets
                .iter()
                .filter(|(_, o)| o.stable < o.end)
                .map(|(tp, o)| {
                    let since = match self.0.get(tp) {
                        Some(&(stable, since)) if stable == o.stable => since,
                        _ => now,
                    };
                    (tp.clone(), (o.stable, since))
                })
                .collect(),
        )
    }

    /// The partitions stuck for `threshold` or longer.
    pub fn suspects(&self, threshold: Duration, now: Timestamp) -> Vec<Suspect> {
        self.0
            .iter()
            .filter_map(|(tp, &(stable, since))| {
                let stuck_for = now.duration_since(since).unsigned_abs();
                (stuck_for >= threshold).then(|| Suspect {
                    partition: tp.clone(),
                    stable,
                    stuck_for,
                })
            })
            .collect()
    }
}

/// An open transaction on a partition, as its leader describes its producers
/// (DescribeProducers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenTransaction {
    pub producer_id: i64,
    pub producer_epoch: i32,
    /// The coordinator epoch of the producer's last marker: an abort marker must carry it.
    pub coordinator_epoch: i32,
    /// The offset of the transaction's first record on this partition.
    pub start_offset: i64,
}

/// What a transaction coordinator knows of a producer id (ListTransactions and
/// DescribeTransactions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorView {
    pub transactional_id: String,
    pub producer_epoch: i32,
    /// `Ongoing`, `PrepareCommit`, `PrepareAbort`, `CompleteCommit`, `CompleteAbort`, `Empty`,
    /// `Dead`, `PrepareEpochFence`.
    pub state: String,
    /// The partitions of its current transaction.
    pub partitions: Vec<TopicPartition>,
}

/// Why an open transaction is hanging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HangingReason {
    /// No coordinator knows the producer id: its transactional id moved on to another producer
    /// id, or expired.
    UnknownProducer,
    /// The coordinator has no transaction in progress for it (its state is given).
    NotInProgress(String),
    /// The coordinator's transaction does not include this partition.
    PartitionNotInTransaction,
    /// The coordinator knows the transactional id at a later epoch: the producer was fenced.
    Fenced { coordinator_epoch: i32 },
}

/// What an open transaction on a stuck partition is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A transaction its coordinator has in progress on this partition: slow, not hanging. The
    /// coordinator ends it at its timeout at the latest.
    InProgress { transactional_id: String },
    /// Hanging: nothing will end it. `owner` is the transactional id the coordinators last
    /// knew the producer by, if any.
    Hanging {
        owner: Option<String>,
        reason: HangingReason,
    },
}

/// The coordinator states in which a transaction is still being ended by its coordinator.
const IN_PROGRESS: [&str; 3] = ["Ongoing", "PrepareCommit", "PrepareAbort"];

/// What the open transaction `open` on `partition` is, given what the coordinators know of its
/// producer id (`None`: no coordinator lists it).
pub fn diagnose(
    open: &OpenTransaction,
    partition: &TopicPartition,
    known: Option<&CoordinatorView>,
) -> Finding {
    let Some(known) = known else {
        return Finding::Hanging {
            owner: None,
            reason: HangingReason::UnknownProducer,
        };
    };
    let hanging = |reason| Finding::Hanging {
        owner: Some(known.transactional_id.clone()),
        reason,
    };
    if known.producer_epoch > open.producer_epoch {
        return hanging(HangingReason::Fenced {
            coordinator_epoch: known.producer_epoch,
        });
    }
    if !IN_PROGRESS.contains(&known.state.as_str()) {
        return hanging(HangingReason::NotInProgress(known.state.clone()));
    }
    if !known.partitions.contains(partition) {
        return hanging(HangingReason::PartitionNotInTransaction);
    }
    Finding::InProgress {
        transactional_id: known.transactional_id.clone(),
    }
}

/// What a topic is to the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicRole {
    /// The repartition topic or the changelog: only this app's processors write to it.
    Internal,
    /// The input, output, duplicates or dead-letter topic: other producers may write to it.
    Shared,
}

/// What the operator does about a finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do: the transaction is in progress.
    Wait,
    /// Write an abort marker for the producer to the partition's leader.
    Abort,
    /// Show it, and say why it is not ended.
    Report { why_not: String },
}

/// Whether to end a hanging transaction. `live_ids`: the transactional ids of this app's pods
/// that run now (a hanging transaction of one of them is left alone unless that pod's producer
/// fenced it); `last_abort`: when this partition was last aborted by the operator (at most
/// once per `threshold`, never in a loop).
pub fn decide(
    finding: &Finding,
    role: TopicRole,
    policy: AbortHangingTransactions,
    live_ids: &[String],
    last_abort: Option<Timestamp>,
    threshold: Duration,
    now: Timestamp,
) -> Action {
    let Finding::Hanging { owner, reason } = finding else {
        return Action::Wait;
    };
    let report = |why_not: &str| Action::Report {
        why_not: why_not.to_string(),
    };
    if policy == AbortHangingTransactions::Never {
        return report("spec.kafka.abortHangingTransactions is Never");
    }
    if role == TopicRole::Shared && policy != AbortHangingTransactions::IfOwnerGoneOnAllTopics {
        return report(
            "the topic is not one of the app's internal topics (other producers may write to it)",
        );
    }
    // A running pod's producer at the open transaction's epoch still holds it; one at a later
    // epoch fenced it, and the transaction is nobody's.
    let fenced = matches!(reason, HangingReason::Fenced { .. });
    if !fenced && owner.as_ref().is_some_and(|id| live_ids.contains(id)) {
        return report("its producer is a running pod of this app, which still holds it");
    }
    if last_abort.is_some_and(|at| now.duration_since(at).unsigned_abs() < threshold) {
        return report("an abort was written less than the threshold ago; waiting for it to show");
    }
    Action::Abort
}

/// How long a partition's last stable offset may stand still behind its end before the
/// transaction holding it is examined: twice the transaction timeout the processors use (a
/// live transaction is ended by its coordinator within one).
pub fn threshold(app: &StreamApp) -> Duration {
    2 * transaction_timeout(&app.spec.kafka.properties)
}

/// The topics of an app that the doctor watches, each with its role.
pub fn watched_topics(app: &StreamApp) -> Vec<(String, TopicRole)> {
    let application_id = application_id(app);
    let topology = &app.spec.topology;
    // The repartition topic only where the processors use it: where it does not exist, a
    // principal without Describe on it would be refused its metadata.
    let mut topics = vec![(changelog_topic(&application_id), TopicRole::Internal)];
    if topology.repartitions() {
        topics.push((repartition_topic(&application_id), TopicRole::Internal));
    }
    topics.extend(
        [
            Some(&topology.input_topic),
            Some(&topology.output_topic),
            Some(&topology.dead_letter_topic),
            topology.duplicates_topic.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| (t.clone(), TopicRole::Shared)),
    );
    topics
}

/// The transactional ids of this app's pods that exist now (`pods`: their names), one per
/// processing thread.
pub fn live_transactional_ids(app: &StreamApp, pods: &[String]) -> Vec<String> {
    let application_id = application_id(app);
    let threads = app.spec.processing_threads.max(1) as usize;
    pods.iter()
        .flat_map(|pod| (0..threads).map(move |t| group_member(pod, t)))
        .map(|member| transactional_id(&application_id, &member))
        .collect()
}

/// One hanging transaction, as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HangingTransaction {
    pub topic: String,
    pub partition: i32,
    pub producer_id: i64,
    /// The offset of its first record on the partition: where read_committed readers stop.
    pub start_offset: i64,
    /// Why it hangs, and what the operator did or why it did not end it.
    pub detail: String,
}

impl HangingTransaction {
    /// What an administrator would run to end it by hand.
    pub fn command(&self, bootstrap: &str) -> String {
        format!(
            "kafka-transactions.sh --bootstrap-server {bootstrap} abort --topic {} --partition {} --start-offset {}",
            self.topic, self.partition, self.start_offset
        )
    }
}

/// What the doctor last found for an app's transactions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransactionsFinding {
    /// No partition is held back by a hanging transaction.
    Healthy,
    /// These are (or were, until the abort the detail names).
    Hanging(Vec<HangingTransaction>),
    /// The doctor could not look (why).
    Unknown(String),
}

/// The reason a hanging transaction is not ended by itself, in words.
pub fn explain(reason: &HangingReason) -> String {
    match reason {
        HangingReason::UnknownProducer => {
            "no transaction coordinator knows its producer any more".into()
        }
        HangingReason::NotInProgress(state) => {
            format!("its coordinator has no transaction in progress ({state})")
        }
        HangingReason::PartitionNotInTransaction => {
            "its coordinator's transaction does not include the partition".into()
        }
        HangingReason::Fenced { coordinator_epoch } => {
            format!("its producer was fenced (the coordinator is at epoch {coordinator_epoch})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn tp(topic: &str, p: i32) -> TopicPartition {
        (topic.to_string(), p)
    }

    fn offsets(list: &[(&str, i32, i64, i64)]) -> BTreeMap<TopicPartition, Offsets> {
        list.iter()
            .map(|&(t, p, stable, end)| (tp(t, p), Offsets { stable, end }))
            .collect()
    }

    #[test]
    fn a_partition_is_suspect_only_after_its_stable_offset_stood_still_for_the_threshold() {
        let threshold = Duration::from_secs(20);
        let first =
            StuckSince::default().observe(&offsets(&[("rep", 0, 10, 50), ("rep", 1, 5, 5)]), at(0));
        assert!(first.suspects(threshold, at(0)).is_empty());
        let later = first.observe(&offsets(&[("rep", 0, 10, 80), ("rep", 1, 5, 9)]), at(25));
        assert_eq!(
            later.suspects(threshold, at(25)),
            vec![Suspect {
                partition: tp("rep", 0),
                stable: 10,
                stuck_for: Duration::from_secs(25),
            }],
            "partition 1 fell behind only now; partition 0 stood still at 10 for 25 s"
        );
    }

    #[test]
    fn a_stable_offset_that_moves_or_catches_up_starts_the_clock_again() {
        let threshold = Duration::from_secs(20);
        let stuck = StuckSince::default().observe(&offsets(&[("rep", 0, 10, 50)]), at(0));
        let moved = stuck.observe(&offsets(&[("rep", 0, 11, 50)]), at(30));
        assert!(
            moved.suspects(threshold, at(30)).is_empty(),
            "it moved: slow, not stuck"
        );
        let caught_up = moved.observe(&offsets(&[("rep", 0, 50, 50)]), at(60));
        assert_eq!(caught_up, StuckSince::default());
        let unread = stuck.observe(&BTreeMap::new(), at(30));
        assert_eq!(
            unread,
            StuckSince::default(),
            "a partition not read is not kept"
        );
    }

    fn open(producer_id: i64, epoch: i32) -> OpenTransaction {
        OpenTransaction {
            producer_id,
            producer_epoch: epoch,
            coordinator_epoch: 3,
            start_offset: 10,
        }
    }

    fn known(state: &str, epoch: i32, partitions: &[TopicPartition]) -> CoordinatorView {
        CoordinatorView {
            transactional_id: "orders-orders-0".into(),
            producer_epoch: epoch,
            state: state.into(),
            partitions: partitions.to_vec(),
        }
    }

    #[test]
    fn a_transaction_its_coordinator_has_in_progress_on_the_partition_is_only_slow() {
        let p = tp("rep", 0);
        for state in ["Ongoing", "PrepareCommit", "PrepareAbort"] {
            assert_eq!(
                diagnose(
                    &open(7, 2),
                    &p,
                    Some(&known(state, 2, std::slice::from_ref(&p)))
                ),
                Finding::InProgress {
                    transactional_id: "orders-orders-0".into()
                }
            );
        }
    }

    #[test]
    fn a_transaction_no_coordinator_will_end_is_hanging_and_says_why() {
        let p = tp("rep", 0);
        let hanging = |reason| Finding::Hanging {
            owner: Some("orders-orders-0".into()),
            reason,
        };
        assert_eq!(
            diagnose(&open(7, 2), &p, None),
            Finding::Hanging {
                owner: None,
                reason: HangingReason::UnknownProducer
            }
        );
        assert_eq!(
            diagnose(&open(7, 2), &p, Some(&known("CompleteAbort", 2, &[]))),
            hanging(HangingReason::NotInProgress("CompleteAbort".into()))
        );
        assert_eq!(
            diagnose(&open(7, 2), &p, Some(&known("Ongoing", 2, &[tp("rep", 1)]))),
            hanging(HangingReason::PartitionNotInTransaction)
        );
        assert_eq!(
            diagnose(
                &open(7, 2),
                &p,
                Some(&known("Ongoing", 3, std::slice::from_ref(&p)))
            ),
            hanging(HangingReason::Fenced {
                coordinator_epoch: 3
            })
        );
    }

    #[test]
    fn only_a_hanging_transaction_of_an_owner_that_is_gone_on_an_internal_topic_is_aborted() {
        let threshold = Duration::from_secs(20);
        let gone = Finding::Hanging {
            owner: Some("orders-orders-2".into()),
            reason: HangingReason::NotInProgress("Empty".into()),
        };
        let live = vec!["orders-orders-0".to_string(), "orders-orders-2".to_string()];
        let decide_with =
            |finding: &Finding, role, policy, live_ids: &[String], last: Option<Timestamp>| {
                decide(finding, role, policy, live_ids, last, threshold, at(100))
            };
        let internal = TopicRole::Internal;
        let shared = TopicRole::Shared;
        let if_gone = AbortHangingTransactions::IfOwnerGone;
        let everywhere = AbortHangingTransactions::IfOwnerGoneOnAllTopics;
        assert_eq!(
            decide_with(&gone, internal, if_gone, &[], None),
            Action::Abort
        );
        assert_eq!(
            decide_with(
                &Finding::Hanging {
                    owner: None,
                    reason: HangingReason::UnknownProducer
                },
                internal,
                if_gone,
                &live,
                None
            ),
            Action::Abort,
            "a producer id no coordinator knows belongs to no live transactional id"
        );
        let not_aborted = [
            decide_with(&gone, internal, AbortHangingTransactions::Never, &[], None),
            decide_with(&gone, shared, if_gone, &[], None),
            decide_with(&gone, internal, if_gone, &live, None),
            decide_with(&gone, internal, if_gone, &[], Some(at(90))),
        ];
        for action in &not_aborted {
            assert!(matches!(action, Action::Report { .. }), "{action:?}");
        }
        assert_eq!(
            decide_with(&gone, shared, everywhere, &[], None),
            Action::Abort,
            "opted in for every topic"
        );
        let fenced = Finding::Hanging {
            owner: Some("orders-orders-2".into()),
            reason: HangingReason::Fenced {
                coordinator_epoch: 4,
            },
        };
        assert_eq!(
            decide_with(&fenced, internal, if_gone, &live, None),
            Action::Abort,
            "the running pod's producer is at a later epoch: the open one is nobody's"
        );
        assert_eq!(
            decide_with(&gone, internal, if_gone, &[], Some(at(70))),
            Action::Abort,
            "the last abort is a threshold old: once more"
        );
        let in_progress = Finding::InProgress {
            transactional_id: "orders-orders-0".into(),
        };
        assert_eq!(
            decide_with(&in_progress, internal, everywhere, &[], None),
            Action::Wait
        );
    }

    #[test]
    fn the_repartition_topic_is_watched_only_where_the_processors_use_it() {
        use streamapp_api::config::{DedupIdSource, Repartition};
        let repartition_watched = |app: &StreamApp| {
            watched_topics(app)
                .contains(&("shop.orders-dedup-repartition".into(), TopicRole::Internal))
        };
        // The sample's id is the record key: the input is partitioned by it already.
        let mut app = crate::testing::app();
        assert_eq!(
            watched_topics(&app),
            [
                ("shop.orders-dedup-changelog", TopicRole::Internal),
                ("orders", TopicRole::Shared),
                ("orders-unique", TopicRole::Shared),
                ("orders-dlq", TopicRole::Shared),
            ]
            .map(|(t, r)| (t.to_string(), r))
        );
        app.spec.topology.dedup_id.source = DedupIdSource::Header;
        app.spec.topology.dedup_id.header = Some("command-id".into());
        assert!(repartition_watched(&app), "{:?}", watched_topics(&app));
        app.spec.topology.repartition = Repartition::Never;
        assert!(!repartition_watched(&app), "{:?}", watched_topics(&app));
    }
}
