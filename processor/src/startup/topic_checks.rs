//! The start-up checks of the topics, in order: the changelog (created if missing, with as many
//! partitions as the input, [`changelog::ensure`]), the repartition topic when the topology
//! repartitions ([`repartition::ensure`]), then every topic the processor writes against the
//! largest record it may send ([`topics::check`]), which also decides the producer's batch size.

use std::fmt::Display;

use rdkafka::config::ClientConfig;
use streamapp_api::config::ResolvedConfig;
use streamapp_processor::topics::{self, WrittenTopic};
use streamapp_processor::{changelog, repartition};
use tokio::runtime::Runtime;

/// What the checks found.
pub(super) struct Checked {
    /// Partitions of the input topic.
    pub input_partitions: u32,
    /// The client properties, with a batch size that every written topic takes.
    pub client: ClientConfig,
}

/// A check that failed.
pub(super) struct Failed {
    pub message: String,
    /// The configuration or the topics must change (restarting does not help); else Kafka did
    /// not answer.
    pub refusal: bool,
}

impl Failed {
    fn new(e: impl Display, refusal: bool) -> Self {
        Failed {
            message: e.to_string(),
            refusal,
        }
    }
}

/// Runs the checks on `runtime`; `progress` is called after each (it keeps the liveness probe
/// answering while Kafka is slow).
pub(super) fn run(
    runtime: &Runtime,
    config: &ResolvedConfig,
    mut client: ClientConfig,
    progress: impl Fn(),
) -> Result<Checked, Failed> {
    let input_partitions = runtime
        .block_on(changelog::ensure(
            &client,
            &config.topology.input_topic,
            &config.changelog_topic,
            config.topology.retention,
        ))
        .map_err(|e| Failed::new(&e, e.is_refusal()))?;
    progress();
    if let Some(topic) = &config.repartition_topic {
        runtime
            .block_on(repartition::ensure(
                &client,
                &config.topology.input_topic,
                input_partitions,
                topic,
            ))
            .map_err(|e| Failed::new(&e, e.is_refusal()))?;
    }
    progress();
    let checked = runtime
        .block_on(topics::check(
            &client,
            &written_topics(config),
            config.topology.max_value_bytes,
        ))
        .map_err(|e| Failed::new(&e, e.is_refusal()))?;
    // Batches larger than a topic takes would be refused as a whole.
    if client.get("batch.size").is_none() {
        let batch = topics::batch_size(checked.smallest_limit);
        client.set("batch.size", batch.to_string());
    }
    progress();
    Ok(Checked {
        input_partitions: input_partitions as u32,
        client,
    })
}

/// The topics the processor writes, each with the field that names it.
fn written_topics(config: &ResolvedConfig) -> Vec<WrittenTopic> {
    let t = &config.topology;
    let written = [
        ("topology.outputTopic", Some(&t.output_topic)),
        ("topology.deadLetterTopic", Some(&t.dead_letter_topic)),
        ("topology.duplicatesTopic", t.duplicates_topic.as_ref()),
        ("the repartition topic", config.repartition_topic.as_ref()),
    ];
    written
        .into_iter()
        .filter_map(|(field, topic)| {
            topic.map(|topic| WrittenTopic {
                field,
                topic: topic.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use streamapp_api::config::ProcessorConfig;

    use super::*;

    fn config(extra: &str) -> ResolvedConfig {
        let yaml = format!(
            "applicationId: app\n\
             kafka:\n  bootstrapServers: kafka:9092\n\
             topology:\n  inputTopic: in\n  outputTopic: out\n  deadLetterTopic: dlq\n{extra}"
        );
        serde_yaml::from_str::<ProcessorConfig>(&yaml)
            .unwrap()
            .resolve()
            .unwrap()
    }

    fn written(config: &ResolvedConfig) -> Vec<(&'static str, String)> {
        written_topics(config)
            .into_iter()
            .map(|w| (w.field, w.topic))
            .collect()
    }

    #[test]
    fn the_written_topics_are_the_outputs_and_the_repartition_topic_when_there_is_one() {
        assert_eq!(
            written(&config("")),
            [
                ("topology.outputTopic", "out".to_string()),
                ("topology.deadLetterTopic", "dlq".to_string()),
            ]
        );
        let repartitioning = config(
            "  duplicatesTopic: dups\n  dedupId:\n    source: JsonPointer\n    jsonPointer: /id\n",
        );
        assert_eq!(
            written(&repartitioning),
            [
                ("topology.outputTopic", "out".to_string()),
                ("topology.deadLetterTopic", "dlq".to_string()),
                ("topology.duplicatesTopic", "dups".to_string()),
                ("the repartition topic", "app-dedup-repartition".to_string()),
            ]
        );
    }
}
