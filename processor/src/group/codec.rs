//! What members and the leader put into the group protocol's opaque bytes: the consumer
//! protocol's subscription and assignment (so that tools such as `kafka-consumer-groups
//! --describe` show the tasks), with StreamApp's facts in their user data as JSON.
//!
//! The assignor's name carries the format's version (`streamapp-v1`): a member that would
//! write another format offers another name, and the coordinator only picks a name every
//! member offers.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use serde::{Deserialize, Serialize};

use crate::group::assignment::MemberAssignment;

/// The assignor this format belongs to.
pub const ASSIGNOR: &str = "streamapp-v1";
/// Kafka's range assignor, which members also offer: the one plain consumers (librdkafka's
/// membership, used without standbys) run, so both kinds of members can share a group during
/// a rollout. Its subscription is the same message (plain consumers ignore the user data).
pub const RANGE: &str = "range";
/// The consumer protocol version of the messages written (1 adds owned partitions).
const CONSUMER_PROTOCOL_VERSION: i16 = 1;

/// A member's report in each JoinGroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The pod the member runs in: a pod's processing threads are members of their own that
    /// share its state directory. Absent from members of releases before processing threads
    /// and standbys went together (each was a pod of its own).
    #[serde(default)]
    pub pod: Option<String>,
    /// The Kubernetes node the member runs on, if known.
    pub node: Option<String>,
    /// The changelog offset each store it holds has applied, by task.
    pub stores: BTreeMap<i32, i64>,
    /// The tasks it was active for in the generation it leaves.
    pub active: BTreeSet<i32>,
    /// The members (instance ids) of the last generation it took part in, as its assignment
    /// named them: whoever leads next learns from them which members are gone.
    #[serde(default)]
    pub members: BTreeSet<String>,
}

/// What a member's assignment says besides its active tasks (the assigned partitions): its
/// standby side, and the generation's members.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct AssignmentData {
    standby: BTreeSet<i32>,
    warm_up: BTreeSet<i32>,
    #[serde(default)]
    members: BTreeSet<String>,
}

/// A member's assignment as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assigned {
    pub share: MemberAssignment,
    /// The generation's members (instance ids); empty under range.
    pub members: BTreeSet<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{what}: {detail}")]
pub struct CodecError {
    what: &'static str,
    detail: String,
}

fn error(what: &'static str, detail: impl ToString) -> CodecError {
    CodecError {
        what,
        detail: detail.to_string(),
    }
}

fn versioned(version: i16, encode: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(version);
    encode(&mut buf).expect("the consumer protocol messages encode");
    buf.freeze()
}

fn unversioned(what: &'static str, mut bytes: Bytes) -> Result<(Bytes, i16), CodecError> {
    if bytes.remaining() < 2 {
        return Err(error(what, "shorter than its version"));
    }
    let version = bytes.get_i16();
    Ok((bytes, version.min(3)))
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// The topics a member reads: the tasks' topic, and the route stage's when there is one.
#[derive(Clone, Copy, Debug)]
pub struct Topics<'a> {
    pub tasks: &'a str,
    pub routes: Option<&'a str>,
}

impl Topics<'_> {
    fn names(&self) -> Vec<StrBytes> {
        std::iter::once(self.tasks)
            .chain(self.routes)
            .map(|t| StrBytes::from_string(t.to_string()))
            .collect()
    }
}

/// The subscription metadata of a member reading `topics` with `report`.
pub fn subscription(topics: Topics<'_>, report: &Report) -> Bytes {
    let topic = topics.tasks;
    let message = ConsumerProtocolSubscription::default()
        .with_topics(topics.names())
        .with_user_data(Some(Bytes::from(
            serde_json::to_vec(report).expect("a report serialises"),
        )))
        .with_owned_partitions(vec![
            kafka_protocol::messages::consumer_protocol_subscription::TopicPartition::default()
                .with_topic(topic_name(topic))
                .with_partitions(report.active.iter().copied().collect()),
        ]);
    versioned(CONSUMER_PROTOCOL_VERSION, |buf| {
        message.encode(buf, CONSUMER_PROTOCOL_VERSION)
    })
}

/// The report inside a member's subscription metadata.
pub fn read_subscription(bytes: Bytes) -> Result<Report, CodecError> {
    let (mut bytes, version) = unversioned("subscription", bytes)?;
    let message = ConsumerProtocolSubscription::decode(&mut bytes, version)
        .map_err(|e| error("subscription", e))?;
    let user_data = message
        .user_data
        .ok_or_else(|| error("subscription", "no user data: not a StreamApp member"))?;
    serde_json::from_slice(&user_data).map_err(|e| error("subscription user data", e))
}

/// The assignment bytes of one member's share: its active tasks as partitions of the tasks'
/// topic and its route tasks as partitions of the route stage's, standbys and warm-ups in the
/// user data.
pub fn assignment(
    topics: Topics<'_>,
    share: &MemberAssignment,
    members: &BTreeSet<String>,
) -> Bytes {
    let data = AssignmentData {
        standby: share.standby.clone(),
        warm_up: share.warm_up.clone(),
        members: members.clone(),
    };
    let mut assigned = vec![
        AssignedPartitions::default()
            .with_topic(topic_name(topics.tasks))
            .with_partitions(share.active.iter().copied().collect()),
    ];
    if let Some(routes) = topics.routes {
        assigned.push(
            AssignedPartitions::default()
                .with_topic(topic_name(routes))
                .with_partitions(share.routes.iter().copied().collect()),
        );
    }
    let message = ConsumerProtocolAssignment::default()
        .with_assigned_partitions(assigned)
        .with_user_data(Some(Bytes::from(
            serde_json::to_vec(&data).expect("assignment data serialises"),
        )));
    versioned(CONSUMER_PROTOCOL_VERSION, |buf| {
        message.encode(buf, CONSUMER_PROTOCOL_VERSION)
    })
}

/// The share inside assignment bytes (empty bytes: no share, as the coordinator hands out to
/// a member the leader left out).
///
/// Under [`RANGE`] the user data is not ours (a plain consumer leading hands each member
/// whatever it likes there, librdkafka the member's own subscription user data): only the
/// partitions count.
pub fn read_assignment(
    topics: Topics<'_>,
    protocol: &str,
    bytes: Bytes,
) -> Result<Assigned, CodecError> {
    if bytes.is_empty() {
        return Ok(Assigned::default());
    }
    let (mut bytes, version) = unversioned("assignment", bytes)?;
    let message = ConsumerProtocolAssignment::decode(&mut bytes, version)
        .map_err(|e| error("assignment", e))?;
    let mut share = MemberAssignment::default();
    for assigned in message.assigned_partitions {
        let topic = assigned.topic.0.as_str();
        if topic == topics.tasks {
            share.active.extend(assigned.partitions);
        } else if Some(topic) == topics.routes {
            share.routes.extend(assigned.partitions);
        } else {
            return Err(error(
                "assignment",
                format!("partitions of topic {topic}, which this member does not read"),
            ));
        }
    }
    let mut members = BTreeSet::new();
    if let Some(user_data) = message.user_data.filter(|_| protocol == ASSIGNOR) {
        let data: AssignmentData =
            serde_json::from_slice(&user_data).map_err(|e| error("assignment user data", e))?;
        share.standby = data.standby;
        share.warm_up = data.warm_up;
        members = data.members;
    }
    Ok(Assigned { share, members })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_and_a_share_survive_their_encoding() {
        let report = Report {
            pod: Some("pod-a".into()),
            node: Some("node-a".into()),
            stores: BTreeMap::from([(0, 120), (3, 7)]),
            active: BTreeSet::from([0]),
            members: BTreeSet::from(["pod-a".into(), "pod-b".into()]),
        };
        let topics = Topics {
            tasks: "repartition",
            routes: Some("in"),
        };
        assert_eq!(
            read_subscription(subscription(topics, &report)).unwrap(),
            report
        );
        let share = MemberAssignment {
            active: BTreeSet::from([0, 2]),
            standby: BTreeSet::from([1]),
            warm_up: BTreeSet::from([3]),
            routes: BTreeSet::from([1, 4]),
        };
        let members = BTreeSet::from(["pod-a".to_string(), "pod-c".to_string()]);
        assert_eq!(
            read_assignment(topics, ASSIGNOR, assignment(topics, &share, &members)).unwrap(),
            Assigned { share, members }
        );
        assert_eq!(
            read_assignment(topics, ASSIGNOR, Bytes::new()).unwrap(),
            Assigned::default()
        );
    }

    #[test]
    fn a_share_of_another_topic_or_a_subscription_without_a_report_is_refused() {
        let share = MemberAssignment {
            active: BTreeSet::from([1]),
            ..Default::default()
        };
        let only = |tasks| Topics {
            tasks,
            routes: None,
        };
        let members = BTreeSet::new();
        assert!(
            read_assignment(
                only("other"),
                ASSIGNOR,
                assignment(only("in"), &share, &members)
            )
            .is_err()
        );
        // Under range, user data that is not ours is no error (what librdkafka leading sends).
        let with_report = versioned(1, |buf| {
            ConsumerProtocolAssignment::default()
                .with_assigned_partitions(vec![
                    AssignedPartitions::default()
                        .with_topic(topic_name("in"))
                        .with_partitions(vec![1]),
                ])
                .with_user_data(Some(Bytes::from_static(br#"{"node":null}"#)))
                .encode(buf, 1)
        });
        assert_eq!(
            read_assignment(only("in"), RANGE, with_report.clone())
                .unwrap()
                .share,
            share
        );
        assert!(read_assignment(only("in"), ASSIGNOR, with_report).is_err());
        // What a plain consumer (librdkafka's range assignor) sends: no user data.
        let plain = versioned(0, |buf| {
            ConsumerProtocolSubscription::default()
                .with_topics(vec![StrBytes::from_static_str("in")])
                .encode(buf, 0)
        });
        assert!(read_subscription(plain).is_err());
    }
}
