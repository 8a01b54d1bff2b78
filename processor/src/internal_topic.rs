//! The processor's internal topics (the changelog, the repartition topic) are created by the
//! processors themselves, at start-up, when missing: this is the one way they are created.
//! What each topic must then look like (its partition count, its configuration) is checked by
//! its own module ([`crate::changelog`], [`crate::repartition`]), which knows what a
//! difference means for it.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::info;

/// An internal topic as the processor creates it.
pub struct InternalTopic<'a> {
    /// What it is, for the log ("changelog", "repartition").
    pub role: &'static str,
    pub name: &'a str,
    /// One per input partition.
    pub partitions: usize,
    /// The topic configs it is created with.
    pub configs: &'a [(&'static str, String)],
}

/// The partition count of `topic` as the broker's metadata gives it; 0 when it does not exist.
pub fn partitions(probe: &BaseConsumer, topic: &str) -> Result<usize, String> {
    let md = probe
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| format!("metadata: {e}"))?;
    Ok(md
        .topics()
        .first()
        .filter(|t| t.error().is_none())
        .map_or(0, |t| t.partitions().len()))
}

/// Creates `topic` when it does not exist (another replica creating it first is fine), and
/// returns its partition count as the broker then gives it.
pub async fn ensure_exists(
    probe: &BaseConsumer,
    admin: &AdminClient<DefaultClientContext>,
    options: &AdminOptions,
    topic: &InternalTopic<'_>,
) -> Result<usize, String> {
    let existing = partitions(probe, topic.name)?;
    if existing > 0 {
        return Ok(existing);
    }
    let mut new = NewTopic::new(
        topic.name,
        topic.partitions as i32,
        TopicReplication::Fixed(-1),
    );
    for (key, value) in topic.configs {
        new = new.set(key, value);
    }
    for r in admin
        .create_topics([&new], options)
        .await
        .map_err(|e| e.to_string())?
    {
        match r {
            Ok(_) => info!(
                topic = topic.name,
                partitions = topic.partitions,
                "created the {} topic",
                topic.role
            ),
            // Another replica created it first: its owner checks it like any existing one.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(format!("creating: {code}")),
        }
    }
    // Metadata may lag creation a little.
    for _ in 0..50 {
        let found = partitions(probe, topic.name)?;
        if found > 0 {
            return Ok(found);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    partitions(probe, topic.name)
}
