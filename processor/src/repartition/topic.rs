//! The repartition topic: created at start-up with one partition per input partition and a
//! delete-only cleanup policy, or refused, saying what to change, when it exists otherwise.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use tracing::warn;

use crate::internal_topic::{self, InternalTopic};

/// How long the repartition topic keeps records the dedup stage has not purged: a bound for
/// the disk if purging stops (as Kafka Streams' purge, it normally removes records seconds
/// after they are processed). The dedup stage must not fall further behind than this.
pub const RETENTION: Duration = Duration::from_secs(7 * 86_400);
/// Segments small enough that purged records free their disk space soon.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
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
    let admin: AdminClient<DefaultClientContext> =
        client.create().map_err(|e| kafka(e.to_string()))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let wanted = InternalTopic {
        role: "repartition",
        name: topic,
        partitions: input_partitions,
        configs: &[
            ("cleanup.policy", "delete".to_string()),
            ("retention.ms", RETENTION.as_millis().to_string()),
            ("retention.bytes", "-1".to_string()),
            ("segment.bytes", SEGMENT_BYTES.to_string()),
            ("message.timestamp.type", "CreateTime".to_string()),
        ],
    };
    let found = internal_topic::ensure_exists(&probe, &admin, &options, &wanted)
        .await
        .map_err(kafka)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_delete_policy_keeps_every_record() {
        assert!(policy_deletes_only("delete"));
        assert!(!policy_deletes_only("compact"));
        assert!(!policy_deletes_only("compact,delete"));
        assert!(!policy_deletes_only("delete, compact"));
    }
}
