//! What Kafka's `kafka-transactions.sh find-hanging` and `abort` do (KIP-664), over connections
//! of our own: the transactions open on partitions (DescribeProducers, asked of each
//! partition's leader), what the transaction coordinators know of their producers
//! (ListTransactions on every broker, DescribeTransactions of one transactional id at its
//! coordinator), and an abort marker written to a partition's leader (WriteTxnMarkers, as
//! `Admin.abortTransaction` does; it needs `ClusterAction` on the cluster).

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeProducersRequest, DescribeTransactionsRequest, ListOffsetsRequest,
    ListTransactionsRequest, MetadataRequest, ProducerId, TopicName, TransactionalId,
    WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;

use crate::Connection;

/// Kafka's `CLUSTER_AUTHORIZATION_FAILED`: the principal lacks `ClusterAction` (abort markers)
/// or `Describe` on the cluster.
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
/// Kafka's `TOPIC_AUTHORIZATION_FAILED`.
pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
/// Kafka's `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`.
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

/// A failed request's error code as a sentence: `what` failed, and for a refusal, the
/// permission (`needs`, e.g. "Read on topic orders") the principal lacks.
pub fn explain(code: i16, what: &str, needs: &str) -> String {
    match code {
        CLUSTER_AUTHORIZATION_FAILED
        | TOPIC_AUTHORIZATION_FAILED
        | TRANSACTIONAL_ID_AUTHORIZATION_FAILED => {
            format!("{what}: not authorised; the principal needs {needs}")
        }
        code => format!("{what}: error code {code}"),
    }
}

/// The brokers and the leader of each partition of some topics (Metadata).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leaders {
    /// Broker id → host:port.
    pub brokers: BTreeMap<i32, String>,
    /// (topic, partition) → the leader's broker id; a partition without a leader is left out.
    pub leaders: BTreeMap<(String, i32), i32>,
}

/// The cluster's brokers and the leaders of `topics`' partitions; a topic that does not exist
/// has none, one the principal may not describe is an error that says so.
pub fn leaders(connection: &mut Connection, topics: &[String]) -> Result<Leaders, String> {
    if !connection.speaks(ApiKey::Metadata) {
        return Err(format!(
            "{} does not speak Metadata version 10 or later (Kafka 2.8)",
            connection.address()
        ));
    }
    let request = MetadataRequest::default().with_topics(Some(
        topics
            .iter()
            .map(|t| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(t.clone()))))
            })
            .collect(),
    ));
    let response = connection.send(&request).map_err(|e| e.to_string())?;
    let brokers = response
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
        .collect();
    let refused: Vec<String> = response
        .topics
        .iter()
        .filter(|t| t.error_code == TOPIC_AUTHORIZATION_FAILED)
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    if !refused.is_empty() {
        return Err(explain(
            TOPIC_AUTHORIZATION_FAILED,
            &format!("reading the metadata of {}", refused.join(", ")),
            &format!("Describe on topic {}", refused.join(", ")),
        ));
    }
    let mut leaders = BTreeMap::new();
    for topic in &response.topics {
        let Some(name) = &topic.name else { continue };
        for p in topic.partitions.iter().filter(|p| p.leader_id.0 >= 0) {
            leaders.insert((name.0.to_string(), p.partition_index), p.leader_id.0);
        }
    }
    Ok(Leaders { brokers, leaders })
}

/// Where the log of each of `partitions` (topic, partition) ends, asked of their leader
/// (`connection`): the last stable offset (`read_committed`: where read_committed readers stop,
/// at the first open transaction) or the high watermark. A partition the leader could not
/// answer for is left out.
pub fn end_offsets(
    connection: &mut Connection,
    partitions: &[(String, i32)],
    read_committed: bool,
) -> Result<BTreeMap<(String, i32), i64>, String> {
    if !connection.speaks(ApiKey::ListOffsets) {
        return Err(format!(
            "{} does not speak ListOffsets version 2 or later",
            connection.address()
        ));
    }
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, partition) in partitions {
        by_topic.entry(topic).or_default().push(*partition);
    }
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(i8::from(read_committed))
        .with_topics(
            by_topic
                .into_iter()
                .map(|(topic, partitions)| {
                    ListOffsetsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                        .with_partitions(
                            partitions
                                .into_iter()
                                .map(|p| {
                                    ListOffsetsPartition::default()
                                        .with_partition_index(p)
                                        // -1: the latest offset.
                                        .with_timestamp(-1)
                                        .with_current_leader_epoch(-1)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    let response = connection.send(&request).map_err(|e| e.to_string())?;
    Ok(response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| p.error_code == 0)
                .map(move |p| ((t.name.0.to_string(), p.partition_index), p.offset))
        })
        .collect())
}

/// A producer of a partition, as its leader describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionProducer {
    pub producer_id: i64,
    pub producer_epoch: i32,
    /// The coordinator epoch of its last transaction marker on the partition (-1: none).
    pub coordinator_epoch: i32,
    /// The first offset of its transaction open on the partition, if one is.
    pub open_transaction_start: Option<i64>,
    /// When it last wrote to the partition (milliseconds since the epoch).
    pub last_write_ms: i64,
}

/// The producers of `partitions` of `topic`, asked of their leader (`connection`): each
/// partition with its producers, or why the leader could not say.
pub fn describe_producers(
    connection: &mut Connection,
    topic: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, Result<Vec<PartitionProducer>, String>>, String> {
    if !connection.speaks(ApiKey::DescribeProducers) {
        return Err(format!(
            "{} does not speak DescribeProducers (Kafka 3.0)",
            connection.address()
        ));
    }
    let request = DescribeProducersRequest::default().with_topics(vec![
        TopicRequest::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_indexes(partitions.to_vec()),
    ]);
    let response = connection.send(&request).map_err(|e| e.to_string())?;
    let mut found = BTreeMap::new();
    for t in response
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
    {
        for p in &t.partitions {
            let answer = if p.error_code != 0 {
                Err(explain(
                    p.error_code,
                    &format!("describing the producers of {topic}-{}", p.partition_index),
                    &format!("Read on topic {topic} (DescribeProducers)"),
                ))
            } else {
                Ok(p.active_producers
                    .iter()
                    .map(|s| PartitionProducer {
                        producer_id: s.producer_id.0,
                        producer_epoch: s.producer_epoch,
                        coordinator_epoch: s.coordinator_epoch,
                        open_transaction_start: (s.current_txn_start_offset >= 0)
                            .then_some(s.current_txn_start_offset),
                        last_write_ms: s.last_timestamp,
                    })
                    .collect())
            };
            found.insert(p.partition_index, answer);
        }
    }
    Ok(found)
}

/// A transaction a coordinator lists (ListTransactions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedTransaction {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: String,
}

/// The transactional ids the coordinators on this broker (`connection`) hold for
/// `producer_ids` (all when empty). Every broker must be asked: each coordinates some.
pub fn list_transactions(
    connection: &mut Connection,
    producer_ids: &[i64],
) -> Result<Vec<ListedTransaction>, String> {
    if !connection.speaks(ApiKey::ListTransactions) {
        return Err(format!(
            "{} does not speak ListTransactions (Kafka 3.0)",
            connection.address()
        ));
    }
    let request = ListTransactionsRequest::default()
        .with_producer_id_filters(producer_ids.iter().map(|&id| ProducerId(id)).collect())
        .with_duration_filter(-1);
    let response = connection.send(&request).map_err(|e| e.to_string())?;
    if response.error_code != 0 {
        return Err(explain(
            response.error_code,
            &format!("listing the transactions of {}", connection.address()),
            "Describe on the transactional ids (ListTransactions)",
        ));
    }
    Ok(response
        .transaction_states
        .iter()
        .map(|t| ListedTransaction {
            transactional_id: t.transactional_id.0.to_string(),
            producer_id: t.producer_id.0,
            state: t.transaction_state.to_string(),
        })
        .collect())
}

/// A transactional id as its coordinator describes it (DescribeTransactions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedTransaction {
    pub state: String,
    pub producer_id: i64,
    pub producer_epoch: i32,
    /// The partitions of its current transaction.
    pub partitions: Vec<(String, i32)>,
}

/// `transactional_id` as its coordinator (`connection`) describes it.
pub fn describe_transaction(
    connection: &mut Connection,
    transactional_id: &str,
) -> Result<DescribedTransaction, String> {
    let response = connection
        .send(
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
                StrBytes::from_string(transactional_id.to_string()),
            )]),
        )
        .map_err(|e| e.to_string())?;
    let state = response
        .transaction_states
        .first()
        .ok_or("DescribeTransactions answered nothing")?;
    if state.error_code != 0 {
        return Err(explain(
            state.error_code,
            &format!("describing transactional id {transactional_id}"),
            &format!("Describe on transactional id {transactional_id} (DescribeTransactions)"),
        ));
    }
    Ok(DescribedTransaction {
        state: state.transaction_state.to_string(),
        producer_id: state.producer_id.0,
        producer_epoch: i32::from(state.producer_epoch),
        partitions: state
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|&p| (t.topic.0.to_string(), p)))
            .collect(),
    })
}

/// Writes an abort marker for `producer` on `topic`-`partition` to the partition's leader
/// (`connection`), ending the transaction it has open there: what `kafka-transactions.sh
/// abort` does. The leader refuses a marker of an epoch older than the producer's.
pub fn write_abort_marker(
    connection: &mut Connection,
    topic: &str,
    partition: i32,
    producer: &PartitionProducer,
) -> Result<(), String> {
    if !connection.speaks(ApiKey::WriteTxnMarkers) {
        return Err(format!(
            "{} does not speak WriteTxnMarkers version 1 (Kafka 2.8)",
            connection.address()
        ));
    }
    let epoch = i16::try_from(producer.producer_epoch)
        .map_err(|_| format!("producer epoch {} out of range", producer.producer_epoch))?;
    let request = WriteTxnMarkersRequest::default().with_markers(vec![
        WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer.producer_id))
            .with_producer_epoch(epoch)
            .with_transaction_result(false)
            .with_coordinator_epoch(producer.coordinator_epoch)
            .with_topics(vec![
                WritableTxnMarkerTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_indexes(vec![partition]),
            ]),
    ]);
    let response = connection.send(&request).map_err(|e| e.to_string())?;
    let code = response
        .markers
        .iter()
        .flat_map(|m| &m.topics)
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition)
        .map(|p| p.error_code)
        .ok_or("WriteTxnMarkers answered nothing for the partition")?;
    match code {
        0 => Ok(()),
        code => Err(explain(
            code,
            &format!(
                "writing an abort marker for producer {} on {topic}-{partition}",
                producer.producer_id
            ),
            "ClusterAction on the cluster (WriteTxnMarkers)",
        )),
    }
}
