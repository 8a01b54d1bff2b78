//! The store's changelog topic: created at start-up when missing, validated when present.
//!
//! One changelog partition per input partition (task p writes changelog partition p), so a
//! partition-count mismatch would silently mix stores: it is a start-up error instead.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::info;

#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    #[error(
        "input topic {topic} does not exist (or has no partitions); create it before starting the processor"
    )]
    NoInput { topic: String },
    #[error(
        "changelog topic {changelog} has {changelog_partitions} partitions but input topic {input} has \
         {input_partitions}: each input partition needs its own changelog partition. Recreate the changelog \
         with {input_partitions} partitions (its data is rebuilt from it, so only do this with the app stopped), \
         or restore the input topic's partition count"
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

fn partitions(client: &BaseConsumer, topic: &str) -> Result<usize, ChangelogError> {
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| ChangelogError::Kafka {
            topic: topic.into(),
            what: format!("metadata: {e}"),
        })?;
    Ok(md
        .topics()
        .first()
        .filter(|t| t.error().is_none())
        .map_or(0, |t| t.partitions().len()))
}

/// Makes sure the changelog exists with as many partitions as the input; returns that count.
pub async fn ensure(
    client: &ClientConfig,
    input: &str,
    changelog: &str,
    retention: Duration,
) -> Result<usize, ChangelogError> {
    let probe: BaseConsumer = client.create().map_err(|e| ChangelogError::Kafka {
        topic: changelog.into(),
        what: e.to_string(),
    })?;
    let input_partitions = partitions(&probe, input)?;
    if input_partitions == 0 {
        return Err(ChangelogError::NoInput {
            topic: input.into(),
        });
    }
    let existing = partitions(&probe, changelog)?;
    if existing == 0 {
        let admin: AdminClient<DefaultClientContext> =
            client.create().map_err(|e| ChangelogError::Kafka {
                topic: changelog.into(),
                what: e.to_string(),
            })?;
        // Compacted (one record per id survives) and deleted after the retention plus a day,
        // like Kafka Streams' window-store changelogs.
        let retention_ms = (retention + Duration::from_secs(86_400))
            .as_millis()
            .to_string();
        let topic = NewTopic::new(
            changelog,
            input_partitions as i32,
            TopicReplication::Fixed(-1),
        )
        .set("cleanup.policy", "compact,delete")
        .set("retention.ms", &retention_ms);
        let result = admin
            .create_topics(
                [&topic],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .map_err(|e| ChangelogError::Kafka {
                topic: changelog.into(),
                what: e.to_string(),
            })?;
        for r in result {
            match r {
                Ok(_) => info!(
                    topic = changelog,
                    partitions = input_partitions,
                    "created the changelog topic"
                ),
                // Another replica created it first: validate below.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => {
                    return Err(ChangelogError::Kafka {
                        topic: changelog.into(),
                        what: format!("creating: {code}"),
                    });
                }
            }
        }
        // Metadata may lag creation a little.
        for _ in 0..50 {
            if partitions(&probe, changelog)? > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let changelog_partitions = partitions(&probe, changelog)?;
    if changelog_partitions != input_partitions {
        return Err(ChangelogError::PartitionMismatch {
            changelog: changelog.into(),
            changelog_partitions,
            input: input.into(),
            input_partitions,
        });
    }
    Ok(input_partitions)
}
