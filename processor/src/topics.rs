//! Start-up checks of the topics the processor writes (output, duplicates, dead letters): each
//! must exist and be visible to this principal, and a record of `topology.maxValueSize` plus
//! its key and headers must fit the broker's `message.max.bytes` and each topic's
//! `max.message.bytes`. A topic that fails these would make every record fail at run time; the
//! processor refuses to start instead, naming the topic and the field.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaRespErr;
use streamapp_api::config::RECORD_OVERHEAD_BYTES;
use tracing::warn;

/// A topic the processor writes, and the configuration field that names it.
#[derive(Clone, Debug)]
pub struct WrittenTopic {
    pub field: &'static str,
    pub topic: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopicError {
    #[error(
        "{field}: topic {topic} does not exist; create it (the processor creates only its changelog)"
    )]
    Missing { field: &'static str, topic: String },
    #[error(
        "{field}: topic {topic} is not authorised for this client ({error}); grant it Describe and Write"
    )]
    Unauthorized {
        field: &'static str,
        topic: String,
        error: String,
    },
    #[error(
        "topology.maxValueSize: {max_value} bytes plus {RECORD_OVERHEAD_BYTES} for key and headers does not fit {what} \
         ({limit} bytes): lower topology.maxValueSize to at most {} bytes or raise {what}",
        limit.saturating_sub(RECORD_OVERHEAD_BYTES)
    )]
    TooSmall {
        what: String,
        limit: u64,
        max_value: u64,
    },
    #[error("checking topic {topic}: {detail}")]
    Kafka { topic: String, detail: String },
}

impl TopicError {
    /// Kafka could not be asked (as opposed to a refusal).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, TopicError::Kafka { .. })
    }
}

/// The size check on its own: every limit (`what`, bytes) must hold a record of `max_value`
/// bytes plus [`RECORD_OVERHEAD_BYTES`].
pub fn check_sizes(max_value: u64, limits: &[(String, u64)]) -> Result<(), TopicError> {
    match limits
        .iter()
        .filter(|(_, limit)| max_value + RECORD_OVERHEAD_BYTES > *limit)
        .min_by_key(|(_, limit)| *limit)
    {
        None => Ok(()),
        Some((what, limit)) => Err(TopicError::TooSmall {
            what: what.clone(),
            limit: *limit,
            max_value,
        }),
    }
}

/// What the checks found.
#[derive(Debug, Default)]
pub struct Checked {
    /// The smallest record-batch limit among the broker and the written topics, when known:
    /// the producer's batches must not be larger, or a batch of small records is refused as a
    /// whole (see [`batch_size`]).
    pub smallest_limit: Option<u64>,
    /// What could not be checked (no DescribeConfigs permission).
    pub warnings: Vec<String>,
}

/// The producer's `batch.size` for the limits found: librdkafka's default (1,000,000) unless a
/// topic or the broker takes less. A record larger than a batch still goes alone, so only a
/// record too large by itself is refused.
pub fn batch_size(smallest_limit: Option<u64>) -> u64 {
    const LIBRDKAFKA_DEFAULT: u64 = 1_000_000;
    smallest_limit.map_or(LIBRDKAFKA_DEFAULT, |l| l.min(LIBRDKAFKA_DEFAULT))
}

/// Checks the written topics against the broker.
pub async fn check(
    client: &ClientConfig,
    topics: &[WrittenTopic],
    max_value: u64,
) -> Result<Checked, TopicError> {
    let kafka = |topic: &str, detail: String| TopicError::Kafka {
        topic: topic.into(),
        detail,
    };
    let probe: BaseConsumer = client.create().map_err(|e| kafka("(all)", e.to_string()))?;
    let mut brokers = Vec::new();
    for t in topics {
        let md = probe
            .fetch_metadata(Some(&t.topic), Duration::from_secs(10))
            .map_err(|e| kafka(&t.topic, format!("metadata: {e}")))?;
        brokers = md.brokers().iter().map(|b| b.id()).collect();
        let found = md.topics().first();
        match found.and_then(|m| m.error()) {
            None if found.is_some_and(|m| !m.partitions().is_empty()) => {}
            None | Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
                return Err(TopicError::Missing {
                    field: t.field,
                    topic: t.topic.clone(),
                });
            }
            Some(e @ RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) => {
                return Err(TopicError::Unauthorized {
                    field: t.field,
                    topic: t.topic.clone(),
                    error: format!("{e:?}"),
                });
            }
            Some(e) => return Err(kafka(&t.topic, format!("metadata: {e:?}"))),
        }
    }

    let admin: AdminClient<DefaultClientContext> =
        client.create().map_err(|e| kafka("(all)", e.to_string()))?;
    let mut specs: Vec<ResourceSpecifier<'_>> = brokers
        .iter()
        .map(|b| ResourceSpecifier::Broker(*b))
        .collect();
    specs.extend(topics.iter().map(|t| ResourceSpecifier::Topic(&t.topic)));
    let described = admin
        .describe_configs(
            specs.iter(),
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| kafka("(all)", format!("describing configs: {e}")))?;
    let mut limits = Vec::new();
    let mut warnings = Vec::new();
    for (spec, result) in specs.iter().zip(described) {
        let (what, key) = match spec {
            ResourceSpecifier::Broker(id) => (
                format!("the broker's (id {id}) message.max.bytes"),
                "message.max.bytes",
            ),
            ResourceSpecifier::Topic(t) => (
                format!("topic {t}'s max.message.bytes"),
                "max.message.bytes",
            ),
            ResourceSpecifier::Group(_) => continue,
        };
        match result {
            Ok(resource) => {
                if let Some(limit) = resource
                    .get(key)
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse().ok())
                {
                    limits.push((what, limit));
                }
            }
            Err(code) => {
                let w = format!(
                    "cannot read {what} ({code}): the record size limit is not checked against it"
                );
                warn!("{w}");
                warnings.push(w);
            }
        }
    }
    check_sizes(max_value, &limits)?;
    Ok(Checked {
        smallest_limit: limits.iter().map(|(_, l)| *l).min(),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_limit_that_cannot_hold_a_record_is_named() {
        let limits = vec![
            (
                "the broker's (id 1) message.max.bytes".to_string(),
                1_048_588,
            ),
            ("topic out's max.message.bytes".to_string(), 500_000),
            ("topic dlq's max.message.bytes".to_string(), 800_000),
        ];
        assert_eq!(check_sizes(400_000, &limits), Ok(()));
        let e = check_sizes(900_000, &limits).unwrap_err();
        assert_eq!(
            e,
            TopicError::TooSmall {
                what: "topic out's max.message.bytes".into(),
                limit: 500_000,
                max_value: 900_000
            }
        );
        let message = e.to_string();
        assert!(message.starts_with("topology.maxValueSize:"), "{message}");
        assert!(message.contains("at most 434464 bytes"), "{message}");
    }

    #[test]
    fn batches_are_never_larger_than_the_smallest_limit() {
        assert_eq!(batch_size(None), 1_000_000);
        assert_eq!(batch_size(Some(1_048_588)), 1_000_000);
        assert_eq!(batch_size(Some(965_536)), 965_536);
    }

    #[test]
    fn the_default_max_value_size_fits_the_brokers_default() {
        let default =
            streamapp_api::units::parse_quantity(&streamapp_api::config::default_max_value_size())
                .unwrap();
        assert_eq!(
            check_sizes(default, &[("broker".into(), 1_048_588)]),
            Ok(())
        );
    }
}
