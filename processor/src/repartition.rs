//! The repartition stage: records re-keyed by their dedup id, so that every repeat of an id
//! reaches the task (and store) of its first occurrence whichever input partition it came on.
//!
//! With `topology.repartition: Auto` and an id that is not the record key, the topology has two
//! sub-topologies, as a Kafka Streams `selectKey` before a stateful step does:
//! 1. the **route** stage (stateless) reads the input, finds each record's id (bad records go to
//!    the dead-letter topic there) and writes it to the internal topic
//!    `<applicationId>-dedup-repartition`, keyed by the id, on the partition [`partition_for`]
//!    picks, with the original key, source and timestamp carried along ([`KEY_HEADER`],
//!    [`SOURCE_HEADER`], the record's own timestamp);
//! 2. the **dedup** stage reads the repartition topic (read_committed) and deduplicates as
//!    without repartitioning; its output carries the original key, headers and timestamp.
//!
//! Both stages' input offsets, the repartition records, the outputs and the changelog records
//! commit in the same transactions (exactly-once across the sub-topologies). What the dedup
//! stage has committed is purged from the repartition topic ([`Purger`]), as Kafka Streams
//! does, so the topic does not grow with the input.
//!
//! This module holds the stage's fixed parts: the topic (created and validated at start-up like
//! the changelog), the partitioner, the header layout and the purger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, info, warn};

/// Header of a repartition record carrying the input record's key (absent value: no key).
pub const KEY_HEADER: &str = "streamapp.repartition.key";
/// Header of a repartition record carrying `topic/partition/offset` of the input record (what
/// a dead letter of the dedup stage names as its source).
pub const SOURCE_HEADER: &str = "streamapp.repartition.source";
/// Prefix of the headers the route stage adds; the dedup stage removes them again.
pub const HEADER_PREFIX: &str = "streamapp.repartition.";

/// How long the repartition topic keeps records the dedup stage has not purged: a bound for
/// the disk if purging stops (as Kafka Streams' purge, it normally removes records seconds
/// after they are processed). The dedup stage must not fall further behind than this.
pub const RETENTION: Duration = Duration::from_secs(7 * 86_400);
/// Segments small enough that purged records free their disk space soon.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// How often the dedup stage's committed offsets are purged (Kafka Streams'
/// `repartition.purge.interval.ms` default).
pub const PURGE_INTERVAL: Duration = Duration::from_secs(30);

/// The repartition partition of a dedup id: Kafka's default partitioner for keyed records
/// (murmur2, as the Java producer and Kafka Streams use it), so the mapping never depends on
/// the client's `partitioner` setting and an input keyed by the id with Kafka's default
/// partitioner lands on the same partition numbers.
pub fn partition_for(id: &[u8], partitions: u32) -> i32 {
    ((murmur2(id) & 0x7fff_ffff) % partitions) as i32
}

/// Kafka's `Utils.murmur2`.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, b) in rest.iter().enumerate().rev() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[derive(Debug, thiserror::Error)]
pub enum RepartitionTopicError {
    #[error(
        "repartition topic {topic} has {found} partitions but input topic {input} has {input_partitions}: \
         the dedup stage needs one repartition partition per input partition. With the app stopped, \
         delete {topic} (the processors create it again; records in it that were not deduplicated \
         yet are lost, so let the app catch up first) or restore the input's partition count"
    )]
    PartitionMismatch {
        topic: String,
        found: usize,
        input: String,
        input_partitions: usize,
    },
    #[error(
        "repartition topic {topic} has cleanup.policy={policy}: it must be delete (compaction would \
         drop records of the same id before the dedup stage reads them); set cleanup.policy=delete on it"
    )]
    Compacted { topic: String, policy: String },
    #[error("repartition topic {topic}: {what}")]
    Kafka { topic: String, what: String },
}

impl RepartitionTopicError {
    /// A refusal the topics must change for (as opposed to Kafka being unreachable).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, RepartitionTopicError::Kafka { .. })
    }
}

/// Whether a `cleanup.policy` value keeps every record until it is deleted (no compaction).
pub fn policy_deletes_only(policy: &str) -> bool {
    policy.split(',').all(|p| p.trim() == "delete")
}

/// Makes sure the repartition topic exists with one partition per input partition and a
/// delete-only cleanup policy.
pub async fn ensure(
    client: &ClientConfig,
    input: &str,
    input_partitions: usize,
    topic: &str,
) -> Result<(), RepartitionTopicError> {
    let kafka = |what: String| RepartitionTopicError::Kafka {
        topic: topic.into(),
        what,
    };
    let probe: BaseConsumer = client.create().map_err(|e| kafka(e.to_string()))?;
    let partitions = |probe: &BaseConsumer| -> Result<usize, RepartitionTopicError> {
        let md = probe
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(|e| kafka(format!("metadata: {e}")))?;
        Ok(md
            .topics()
            .first()
            .filter(|t| t.error().is_none())
            .map_or(0, |t| t.partitions().len()))
    };
    let admin: AdminClient<DefaultClientContext> =
        client.create().map_err(|e| kafka(e.to_string()))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    if partitions(&probe)? == 0 {
        let retention = RETENTION.as_millis().to_string();
        let segment = SEGMENT_BYTES.to_string();
        let new = NewTopic::new(topic, input_partitions as i32, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "delete")
            .set("retention.ms", &retention)
            .set("retention.bytes", "-1")
            .set("segment.bytes", &segment)
            .set("message.timestamp.type", "CreateTime");
        for r in admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| kafka(e.to_string()))?
        {
            match r {
                Ok(_) => info!(
                    topic,
                    partitions = input_partitions,
                    "created the repartition topic"
                ),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(kafka(format!("creating: {code}"))),
            }
        }
        for _ in 0..50 {
            if partitions(&probe)? > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let found = partitions(&probe)?;
    if found != input_partitions {
        return Err(RepartitionTopicError::PartitionMismatch {
            topic: topic.into(),
            found,
            input: input.into(),
            input_partitions,
        });
    }
    match admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(|e| kafka(format!("describing its configuration: {e}")))?
        .into_iter()
        .next()
    {
        Some(Ok(resource)) => {
            let policy = resource
                .get("cleanup.policy")
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| "delete".into());
            if !policy_deletes_only(&policy) {
                return Err(RepartitionTopicError::Compacted {
                    topic: topic.into(),
                    policy,
                });
            }
        }
        Some(Err(code)) => {
            warn!(topic, error = %code, "cannot read the repartition topic's configuration: its cleanup policy is not checked");
        }
        None => return Err(kafka("no answer describing its configuration".into())),
    }
    Ok(())
}

/// Deletes what the dedup stage has committed from the repartition topic, on a thread of its
/// own: the processing loop hands it the committed offsets and never waits for the broker.
///
/// A partition counts as purged up to an offset only once the broker said so: a purge that
/// failed (a broker away) is asked for again at the next interval, even when the partition
/// has been idle since.
pub struct Purger {
    tx: mpsc::Sender<BTreeMap<i32, i64>>,
    /// Offsets the broker confirmed, by partition (written by the purge thread).
    purged: Arc<Mutex<BTreeMap<i32, i64>>>,
}

/// The committed offsets still to purge: those the broker has not confirmed yet.
pub fn still_to_purge(
    committed: &BTreeMap<i32, i64>,
    purged: &BTreeMap<i32, i64>,
) -> BTreeMap<i32, i64> {
    committed
        .iter()
        .filter(|(p, o)| purged.get(p).is_none_or(|done| done < o))
        .map(|(&p, &o)| (p, o))
        .collect()
}

impl Purger {
    pub fn start(client: &ClientConfig, topic: &str) -> Result<Purger, rdkafka::error::KafkaError> {
        // The first client is made here so that a bad configuration fails the start.
        let first: AdminClient<DefaultClientContext> = client.create()?;
        let client = client.clone();
        let (tx, rx) = mpsc::channel::<BTreeMap<i32, i64>>();
        let topic = topic.to_string();
        let purged = Arc::new(Mutex::new(BTreeMap::new()));
        let confirmed = purged.clone();
        std::thread::Builder::new()
            .name("repartition-purge".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("purge runtime");
                let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
                let mut admin = Some(first);
                // Ends when the engine (the sender) goes.
                while let Ok(mut offsets) = rx.recv() {
                    // Only the newest request matters.
                    while let Ok(newer) = rx.try_recv() {
                        offsets.extend(newer);
                    }
                    let client_now = match admin.take() {
                        Some(a) => a,
                        None => match client.create() {
                            Ok(a) => a,
                            Err(e) => {
                                warn!(topic = %topic, error = %e, "no admin client to purge the repartition topic; it is asked for again at the next interval");
                                continue;
                            }
                        },
                    };
                    let mut tpl = TopicPartitionList::new();
                    for (&p, &o) in &offsets {
                        tpl.add_partition_offset(&topic, p, rdkafka::Offset::Offset(o))
                            .expect("valid offset");
                    }
                    let mut failed = false;
                    match runtime.block_on(client_now.delete_records(&tpl, &options)) {
                        Ok(result) => {
                            let mut confirmed = confirmed.lock().expect("purged offsets");
                            for e in result.elements() {
                                match e.error() {
                                    Err(err) => {
                                        failed = true;
                                        warn!(topic = %topic, partition = e.partition(), error = %err, "purging the repartition topic failed; it is asked for again at the next interval");
                                    }
                                    Ok(()) => {
                                        if let Some(&o) = offsets.get(&e.partition()) {
                                            confirmed.insert(e.partition(), o);
                                        }
                                    }
                                }
                            }
                            debug!(topic = %topic, ?offsets, "purged the repartition topic");
                        }
                        Err(e) => {
                            failed = true;
                            warn!(topic = %topic, error = %e, "purging the repartition topic failed; it is asked for again at the next interval")
                        }
                    }
                    // After a failure the next attempt gets a new client: one that lived
                    // through a broker restart can keep answering from a stale view of the
                    // partitions' leaders ("No such entry") however often it is asked.
                    if !failed {
                        admin = Some(client_now);
                    }
                }
            })
            .expect("purge thread");
        Ok(Purger { tx, purged })
    }

    /// Asks for every record before `committed` (partition → committed offset) to be deleted,
    /// where the broker has not confirmed that yet.
    pub fn purge(&self, committed: &BTreeMap<i32, i64>) {
        let offsets = still_to_purge(committed, &self.purged.lock().expect("purged offsets"));
        if !offsets.is_empty() {
            let _ = self.tx.send(offsets);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of Kafka's own `Utils.murmur2` and `toPositive(murmur2(key)) % 8` (kafka-clients
    /// 4.4.0), so the same id lands on the partition a Java producer would choose.
    #[test]
    fn ids_are_partitioned_like_kafkas_default_partitioner() {
        let cases: [(&str, i32, i32); 7] = [
            ("", 275_646_681, 1),
            ("a", -1_563_381_124, 4),
            ("ab", 316_155_434, 2),
            ("abc", 479_470_107, 3),
            ("abcd", -1_323_649_548, 4),
            ("cmd-000042", -1_550_143_317, 3),
            ("21", -973_932_308, 4),
        ];
        for (id, hash, partition) in cases {
            assert_eq!(murmur2(id.as_bytes()) as i32, hash, "murmur2({id:?})");
            assert_eq!(partition_for(id.as_bytes(), 8), partition, "{id:?}");
        }
    }

    #[test]
    fn a_purge_the_broker_did_not_confirm_is_asked_for_again_while_the_partition_is_idle() {
        let committed = BTreeMap::from([(0, 100), (1, 50)]);
        assert_eq!(
            still_to_purge(&committed, &BTreeMap::new()),
            committed,
            "nothing confirmed yet"
        );
        // Partition 0's purge went through; partition 1's failed (a broker away) and the
        // partition got no record since: it is still asked for.
        let confirmed = BTreeMap::from([(0, 100)]);
        assert_eq!(
            still_to_purge(&committed, &confirmed),
            BTreeMap::from([(1, 50)])
        );
        assert!(still_to_purge(&committed, &BTreeMap::from([(0, 100), (1, 50)])).is_empty());
    }

    #[test]
    fn only_a_delete_policy_keeps_every_record() {
        assert!(policy_deletes_only("delete"));
        assert!(!policy_deletes_only("compact"));
        assert!(!policy_deletes_only("compact,delete"));
        assert!(!policy_deletes_only("delete, compact"));
    }
}
