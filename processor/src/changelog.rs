//! The store's changelog topic: created at start-up when missing, validated and reconciled when
//! present.
//!
//! One changelog partition per input partition (task p writes changelog partition p), so a
//! partition-count mismatch would silently mix stores: it is a start-up error instead.
//!
//! The processor owns the changelog's retention: records must outlive the window they
//! deduplicate, so `retention.ms` follows `topology.retention` (plus a day, like Kafka Streams'
//! window-store changelogs) also when it changes after creation, the cleanup policy is
//! `compact,delete`, and `retention.bytes` is unlimited (deleting by size would forget ids
//! that should still deduplicate).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ConfigSource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use tracing::{info, warn};

use crate::internal_topic::{self, InternalTopic};

/// The changelog's cleanup policy.
pub const CLEANUP_POLICY: &str = "compact,delete";
/// How much longer than the window the changelog keeps records.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(86_400);

#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    #[error(
        "input topic {topic} (topology.inputTopic) does not exist (or has no partitions); create it before starting the processor"
    )]
    NoInput { topic: String },
    #[error(
        "changelog topic {changelog} has {changelog_partitions} partitions but input topic {input} has \
         {input_partitions}: each input partition needs its own changelog partition. Restore the input \
         topic's partition count, or (with the app stopped) recreate the changelog with {input_partitions} \
         partitions: the stores are then rebuilt from the new, empty changelog, so ids remembered only in \
         the old one are forgotten"
    )]
    PartitionMismatch {
        changelog: String,
        changelog_partitions: usize,
        input: String,
        input_partitions: usize,
    },
    #[error("changelog topic {topic}: {what}")]
    Kafka { topic: String, what: String },
}

impl ChangelogError {
    /// A refusal the configuration or the topics must change for (as opposed to Kafka being
    /// unreachable): the process exits with the configuration exit code.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, ChangelogError::Kafka { .. })
    }
}

/// The changelog's `retention.ms` for a window of `retention`.
pub fn retention_ms(retention: Duration) -> String {
    (retention + RETENTION_MARGIN).as_millis().to_string()
}

/// A topic config as described by the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedConfig {
    pub value: Option<String>,
    /// Set on the topic itself (not inherited from the broker or a default).
    pub topic_level: bool,
}

/// The topic-level configs the changelog should have, when they differ from what it has:
/// every config set on the topic now, with the ones the processor owns corrected. (The
/// AlterConfigs request replaces all topic-level configs, so the others are passed through.)
/// Returns `None` when nothing needs to change, else the full set and what changed.
pub fn reconcile(
    current: &BTreeMap<String, DescribedConfig>,
    retention: Duration,
) -> Option<(BTreeMap<String, String>, Vec<String>)> {
    let desired = [
        ("cleanup.policy", CLEANUP_POLICY.to_string()),
        ("retention.ms", retention_ms(retention)),
        ("retention.bytes", "-1".to_string()),
    ];
    let mut set: BTreeMap<String, String> = current
        .iter()
        .filter(|(_, c)| c.topic_level)
        .filter_map(|(k, c)| Some((k.clone(), c.value.clone()?)))
        .collect();
    let mut changes = Vec::new();
    for (key, want) in desired {
        let have = current.get(key).and_then(|c| c.value.clone());
        let same = match key {
            // The same policies in any order.
            "cleanup.policy" => have.as_deref().is_some_and(|h| {
                let mut a: Vec<&str> = h.split(',').map(str::trim).collect();
                let mut b: Vec<&str> = want.split(',').collect();
                a.sort();
                b.sort();
                a == b
            }),
            _ => have.as_deref() == Some(want.as_str()),
        };
        if !same {
            changes.push(format!(
                "{key}: {} -> {want}",
                have.as_deref().unwrap_or("unset")
            ));
            set.insert(key.to_string(), want);
        }
    }
    (!changes.is_empty()).then_some((set, changes))
}

/// The changelog topic's id (KIP-516), which a topic deleted and created again under the same
/// name does not keep: `None` when the broker does not tell ids (before Kafka 2.8). Asked over
/// the processor's own Kafka connection (librdkafka does not expose topic ids).
pub fn topic_id(client: &ClientConfig, topic: &str) -> Result<Option<[u8; 16]>, String> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{ApiKey, MetadataRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;

    let mut connection = streamapp_kafka_wire::open_first(
        &streamapp_kafka_wire::bootstrap_servers(client),
        &format!("{topic}-id"),
        Duration::from_secs(10),
        &streamapp_kafka_wire::Security::from_client(client)?,
    )?;
    if !connection.speaks(ApiKey::Metadata) {
        return Ok(None);
    }
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(StrBytes::from_string(topic.to_string())),
        ))]));
    let response = connection.send(&request).map_err(|e| e.to_string())?;
    let found = response
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .ok_or_else(|| format!("the metadata of {topic} does not name it"))?;
    if found.error_code != 0 {
        return Err(format!(
            "metadata of {topic}: error code {}",
            found.error_code
        ));
    }
    Ok((!found.topic_id.is_nil()).then(|| *found.topic_id.as_bytes()))
}

/// Makes sure the changelog exists with as many partitions as the input and the retention the
/// window needs; returns the input's partition count.
pub async fn ensure(
    client: &ClientConfig,
    input: &str,
    changelog: &str,
    retention: Duration,
) -> Result<usize, ChangelogError> {
    let kafka = |what: String| ChangelogError::Kafka {
        topic: changelog.into(),
        what,
    };
    let probe: BaseConsumer = client.create().map_err(|e| kafka(e.to_string()))?;
    let input_partitions =
        internal_topic::partitions(&probe, input).map_err(|what| ChangelogError::Kafka {
            topic: input.into(),
            what,
        })?;
    if input_partitions == 0 {
        return Err(ChangelogError::NoInput {
            topic: input.into(),
        });
    }
    let admin: AdminClient<DefaultClientContext> =
        client.create().map_err(|e| kafka(e.to_string()))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let topic = InternalTopic {
        role: "changelog",
        name: changelog,
        partitions: input_partitions,
        configs: &[
            ("cleanup.policy", CLEANUP_POLICY.to_string()),
            ("retention.ms", retention_ms(retention)),
            ("retention.bytes", "-1".to_string()),
        ],
    };
    let changelog_partitions = internal_topic::ensure_exists(&probe, &admin, &options, &topic)
        .await
        .map_err(kafka)?;
    if changelog_partitions != input_partitions {
        return Err(ChangelogError::PartitionMismatch {
            changelog: changelog.into(),
            changelog_partitions,
            input: input.into(),
            input_partitions,
        });
    }
    reconcile_configs(&admin, &options, changelog, retention).await?;
    Ok(input_partitions)
}

async fn reconcile_configs(
    admin: &AdminClient<DefaultClientContext>,
    options: &AdminOptions,
    changelog: &str,
    retention: Duration,
) -> Result<(), ChangelogError> {
    let kafka = |what: String| ChangelogError::Kafka {
        topic: changelog.into(),
        what,
    };
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(changelog)], options)
        .await
        .map_err(|e| kafka(format!("describing its configuration: {e}")))?;
    let resource = match described.into_iter().next() {
        Some(Ok(r)) => r,
        Some(Err(code)) => {
            // Without DescribeConfigs permission the processor cannot tell; it says so.
            warn!(topic = changelog, error = %code, "cannot read the changelog's configuration: its retention is not checked");
            return Ok(());
        }
        None => return Err(kafka("no answer describing its configuration".into())),
    };
    let current: BTreeMap<String, DescribedConfig> = resource
        .entries
        .into_iter()
        .map(|e| {
            (
                e.name,
                DescribedConfig {
                    value: e.value,
                    topic_level: e.source == ConfigSource::DynamicTopic,
                },
            )
        })
        .collect();
    let Some((set, changes)) = reconcile(&current, retention) else {
        return Ok(());
    };
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(changelog));
    for (k, v) in &set {
        alter = alter.set(k, v);
    }
    let result = admin
        .alter_configs([&alter], options)
        .await
        .map_err(|e| kafka(format!("altering its configuration: {e}")))?;
    match result.into_iter().next() {
        Some(Ok(_)) => {
            info!(topic = changelog, changes = %changes.join(", "), "reconciled the changelog's configuration with the topology");
            Ok(())
        }
        Some(Err((_, code))) => Err(kafka(format!(
            "cannot set {} ({code}): the changelog must keep records for topology.retention plus a day",
            changes.join(", ")
        ))),
        None => Err(kafka("no answer altering its configuration".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(entries: &[(&str, &str, bool)]) -> BTreeMap<String, DescribedConfig> {
        entries
            .iter()
            .map(|(k, v, topic_level)| {
                (
                    k.to_string(),
                    DescribedConfig {
                        value: Some(v.to_string()),
                        topic_level: *topic_level,
                    },
                )
            })
            .collect()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_changelog_that_matches_the_window_is_left_alone() {
        let current = described(&[
            ("cleanup.policy", "delete,compact", true),
            ("retention.ms", "90000000", true),
            ("retention.bytes", "-1", false),
        ]);
        assert_eq!(reconcile(&current, HOUR), None);
    }

    #[test]
    fn a_longer_window_raises_the_retention_and_keeps_other_topic_settings() {
        let current = described(&[
            ("cleanup.policy", "compact,delete", true),
            ("retention.ms", "90000000", true),
            ("retention.bytes", "-1", false),
            ("min.insync.replicas", "2", true),
            ("segment.bytes", "1073741824", false),
        ]);
        let (set, changes) = reconcile(&current, 2 * HOUR).unwrap();
        assert_eq!(set["retention.ms"], (2 * 3600 + 86_400).to_string() + "000");
        assert_eq!(set["min.insync.replicas"], "2", "passed through");
        assert!(
            !set.contains_key("segment.bytes"),
            "inherited settings stay inherited"
        );
        assert_eq!(changes, ["retention.ms: 90000000 -> 93600000"]);
    }

    #[test]
    fn a_delete_only_policy_or_a_size_limit_is_corrected() {
        let current = described(&[
            ("cleanup.policy", "delete", true),
            ("retention.ms", "90000000", true),
            ("retention.bytes", "1000000", false),
        ]);
        let (set, changes) = reconcile(&current, HOUR).unwrap();
        assert_eq!(set["cleanup.policy"], CLEANUP_POLICY);
        assert_eq!(set["retention.bytes"], "-1");
        assert_eq!(changes.len(), 2);
    }
}
