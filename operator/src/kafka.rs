//! The operator's view of a StreamApp's Kafka, and the admin operations it runs there.
//!
//! The operator reaches each StreamApp's brokers with that StreamApp's own connection settings
//! and credentials (`spec.kafka`, its SASL and TLS Secrets), to check its topics at reconcile
//! time, to report its consumer group's lag, and to reset or clean up after it. librdkafka's
//! calls block, so the reconciler runs them on the blocking pool ([`Kafka::observe`]).
//!
//! What the observations mean for the status is decided by pure functions here
//! ([`topic_problems`], [`lag`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use streamapp_api::config::CLIENT_DEFAULTS;
use streamapp_api::crd::StreamApp;
use streamapp_kafka_wire::{
    Connection, CoordinatorKind, Security, bootstrap_servers, groups, open_coordinator,
};

/// Timeout of each broker request.
const REQUEST: Duration = Duration::from_secs(3);

/// Where an offset reset moves the input offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResetTarget {
    Earliest,
    Latest,
    /// The first offset at or after this time (Unix ms); the end where there is none.
    Time(i64),
}

impl ResetTarget {
    /// `earliest`, `latest` or an RFC 3339 time, as the reset annotation takes them.
    pub fn parse(value: &str) -> Result<ResetTarget, String> {
        match value.trim() {
            "earliest" => Ok(ResetTarget::Earliest),
            "latest" => Ok(ResetTarget::Latest),
            other => other
                .parse::<k8s_openapi::jiff::Timestamp>()
                .map(|t| ResetTarget::Time(t.as_millisecond()))
                .map_err(|e| {
                    format!("{other:?} is neither earliest, latest nor an RFC 3339 time ({e})")
                }),
        }
    }
}

/// The topics a StreamApp uses and how many partitions each has (None: it does not exist).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicsView {
    pub partitions: BTreeMap<String, Option<usize>>,
}

/// One look at a StreamApp's Kafka.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub topics: TopicsView,
    /// End offset of each input partition.
    pub input_ends: Vec<i64>,
    /// The group's committed offset on each input partition (None: nothing committed).
    pub committed: Vec<Option<i64>>,
    /// The same for the repartition topic, when it exists (the dedup stage's input).
    pub repartition_ends: Vec<i64>,
    pub repartition_committed: Vec<Option<i64>>,
    /// The consumer group's state (`Empty`, `Stable`, `Dead`, ...), when it could be read.
    pub group_state: Option<String>,
    /// The instance ids of the group's static members (the processors' threads), or why
    /// they could not be read.
    pub static_members: Result<Vec<String>, String>,
}

/// A client configuration for one StreamApp's brokers.
#[derive(Clone)]
pub struct Kafka {
    config: ClientConfig,
}

fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

impl Kafka {
    /// The connection the StreamApp's processors use: bootstrap servers, its extra properties,
    /// the SASL credentials and TLS material from its Secrets (`secrets` by name). Errors name
    /// what is missing.
    pub fn for_app(app: &StreamApp, secrets: &BTreeMap<String, Secret>) -> Result<Kafka, String> {
        let spec = &app.spec.kafka;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &spec.bootstrap_servers);
        for (k, v) in CLIENT_DEFAULTS {
            config.set(*k, *v);
        }
        for (k, v) in &spec.properties {
            config.set(k, v);
        }
        config.set("client.id", "streamapp-operator");
        if let Some(sasl) = &spec.sasl {
            let secret = secrets.get(&sasl.secret_name).ok_or_else(|| {
                format!(
                    "Secret {} (spec.kafka.sasl) does not exist",
                    sasl.secret_name
                )
            })?;
            for (property, key) in [
                ("sasl.username", &sasl.username_key),
                ("sasl.password", &sasl.password_key),
            ] {
                let value = secret_value(secret, key).ok_or_else(|| {
                    format!(
                        "Secret {} has no key {key} (spec.kafka.sasl)",
                        sasl.secret_name
                    )
                })?;
                config.set(property, value);
            }
        }
        if let Some(tls) = &spec.tls {
            let secret = secrets.get(&tls.secret_name).ok_or_else(|| {
                format!("Secret {} (spec.kafka.tls) does not exist", tls.secret_name)
            })?;
            let ca = secret_value(secret, "ca.crt").ok_or_else(|| {
                format!(
                    "Secret {} has no key ca.crt (spec.kafka.tls)",
                    tls.secret_name
                )
            })?;
            config.set("ssl.ca.pem", ca);
            if let (Some(cert), Some(key)) = (
                secret_value(secret, "tls.crt"),
                secret_value(secret, "tls.key"),
            ) {
                config.set("ssl.certificate.pem", cert);
                config.set("ssl.key.pem", key);
            }
            if !spec.properties.contains_key("security.protocol") {
                config.set("security.protocol", "ssl");
            }
        }
        Ok(Kafka { config })
    }

    /// The client properties of the app's brokers (bootstrap, security).
    pub fn client_config(&self) -> &ClientConfig {
        &self.config
    }

    fn consumer(&self, group: Option<&str>) -> Result<BaseConsumer, String> {
        let mut config = self.config.clone();
        config.set("enable.auto.commit", "false");
        if let Some(group) = group {
            config.set("group.id", group);
        }
        config
            .create()
            .map_err(|e| format!("creating a Kafka client: {e}"))
    }

    /// Topics, input offsets and the group, in one blocking round of requests; run on the
    /// blocking pool.
    pub async fn observe(
        &self,
        topics: Vec<String>,
        input: String,
        repartition: Option<String>,
        group: String,
    ) -> Result<Observation, String> {
        let kafka = self.clone();
        tokio::task::spawn_blocking(move || {
            kafka.observe_blocking(&topics, &input, repartition.as_deref(), &group)
        })
        .await
        .map_err(|e| format!("the Kafka client panicked: {e}"))?
    }

    fn observe_blocking(
        &self,
        topics: &[String],
        input: &str,
        repartition: Option<&str>,
        group: &str,
    ) -> Result<Observation, String> {
        let consumer = self.consumer(Some(group))?;
        let mut view = TopicsView::default();
        // One topic at a time: asking for all of them would list every topic of the cluster.
        for name in topics {
            let metadata = consumer.fetch_metadata(Some(name), REQUEST).map_err(|e| {
                format!(
                    "reading the metadata of topic {name} from {}: {e}",
                    self.bootstrap()
                )
            })?;
            let partitions = metadata
                .topics()
                .iter()
                .find(|t| t.name() == name && t.error().is_none())
                .map(|t| t.partitions().len())
                .filter(|n| *n > 0);
            view.partitions.insert(name.clone(), partitions);
        }
        let offsets = |topic: &str| -> Result<(Vec<i64>, Vec<Option<i64>>), String> {
            let partitions = view.partitions.get(topic).copied().flatten().unwrap_or(0);
            self.ends_and_committed(&consumer, topic, partitions as i32, group)
        };
        let (input_ends, committed) = offsets(input)?;
        let (repartition_ends, repartition_committed) = match repartition {
            Some(topic) => offsets(topic)?,
            None => (Vec::new(), Vec::new()),
        };
        let group_state = consumer
            .fetch_group_list(Some(group), REQUEST)
            .ok()
            .and_then(|list| list.groups().first().map(|g| g.state().to_string()));
        Ok(Observation {
            topics: view,
            input_ends,
            committed,
            repartition_ends,
            repartition_committed,
            group_state,
            static_members: self
                .group_coordinator(group)
                .and_then(|mut c| groups::static_members(&mut c, group)),
        })
    }

    /// A connection of our own to `group`'s coordinator, for the requests librdkafka does not
    /// send.
    fn group_coordinator(&self, group: &str) -> Result<Connection, String> {
        open_coordinator(
            &bootstrap_servers(&self.config),
            "streamapp-operator",
            REQUEST,
            &Security::from_client(&self.config)?,
            CoordinatorKind::Group,
            group,
        )
    }

    /// Removes the static members `instance_ids` from `group` (their pods are gone for good),
    /// so the group rebalances now rather than after the session timeout. Returns the ids
    /// removed; one that was no longer a member is not among them.
    pub async fn remove_static_members(
        &self,
        group: String,
        instance_ids: Vec<String>,
    ) -> Result<Vec<String>, String> {
        let kafka = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut coordinator = kafka.group_coordinator(&group)?;
            let answers = groups::remove_static_members(&mut coordinator, &group, &instance_ids)?;
            let mut removed = Vec::new();
            for (id, code) in answers {
                match code {
                    0 => removed.push(id),
                    groups::UNKNOWN_MEMBER_ID => {}
                    code => {
                        return Err(format!(
                            "removing member {id} of consumer group {group}: error code {code}"
                        ));
                    }
                }
            }
            Ok(removed)
        })
        .await
        .map_err(|e| format!("the Kafka client panicked: {e}"))?
    }

    /// The end offset of each of `topic`'s `partitions` and what `group` committed there.
    fn ends_and_committed(
        &self,
        consumer: &BaseConsumer,
        topic: &str,
        partitions: i32,
        group: &str,
    ) -> Result<(Vec<i64>, Vec<Option<i64>>), String> {
        if partitions == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut ends = Vec::new();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, REQUEST)
                .map_err(|e| format!("reading the end of {topic}/{p}: {e}"))?;
            ends.push(high);
            tpl.add_partition(topic, p);
        }
        let found = consumer
            .committed_offsets(tpl, REQUEST)
            .map_err(|e| format!("reading the offsets of consumer group {group}: {e}"))?;
        let committed = (0..partitions)
            .map(
                |p| match found.find_partition(topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                },
            )
            .collect();
        Ok((ends, committed))
    }

    pub fn bootstrap(&self) -> String {
        self.config
            .get("bootstrap.servers")
            .unwrap_or_default()
            .to_string()
    }

    /// Moves the group's committed input offsets to `target`. Only allowed by the broker when
    /// the group has no members.
    pub async fn reset_offsets(
        &self,
        group: String,
        input: String,
        target: ResetTarget,
    ) -> Result<(), String> {
        let kafka = self.clone();
        tokio::task::spawn_blocking(move || kafka.reset_offsets_blocking(&group, &input, &target))
            .await
            .map_err(|e| format!("the Kafka client panicked: {e}"))?
    }

    fn reset_offsets_blocking(
        &self,
        group: &str,
        input: &str,
        target: &ResetTarget,
    ) -> Result<(), String> {
        let consumer = self.consumer(Some(group))?;
        let metadata = consumer
            .fetch_metadata(Some(input), REQUEST)
            .map_err(|e| format!("reading the metadata of {input}: {e}"))?;
        let partitions = metadata
            .topics()
            .first()
            .map(|t| t.partitions().len())
            .unwrap_or(0) as i32;
        let mut offsets = TopicPartitionList::new();
        for p in 0..partitions {
            let (low, high) = consumer
                .fetch_watermarks(input, p, REQUEST)
                .map_err(|e| format!("reading the offsets of {input}/{p}: {e}"))?;
            let offset = match target {
                ResetTarget::Earliest => low,
                ResetTarget::Latest => high,
                ResetTarget::Time(ms) => {
                    let mut query = TopicPartitionList::new();
                    query
                        .add_partition_offset(input, p, Offset::Offset(*ms))
                        .map_err(|e| e.to_string())?;
                    let found = consumer.offsets_for_times(query, REQUEST).map_err(|e| {
                        format!("looking up the offsets of {input}/{p} at {ms}: {e}")
                    })?;
                    match found.find_partition(input, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        // No record at or after the time: start at the end.
                        _ => high,
                    }
                }
            };
            offsets
                .add_partition_offset(input, p, Offset::Offset(offset))
                .map_err(|e| e.to_string())?;
        }
        consumer
            .commit(&offsets, CommitMode::Sync)
            .map_err(|e| format!("committing the reset offsets of consumer group {group}: {e}"))
    }

    /// Deletes topics; those that do not exist are fine.
    pub async fn delete_topics(&self, names: &[String]) -> Result<(), String> {
        let admin: AdminClient<DefaultClientContext> = self
            .config
            .create()
            .map_err(|e| format!("creating a Kafka admin client: {e}"))?;
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let results = admin
            .delete_topics(&refs, &AdminOptions::new().operation_timeout(Some(REQUEST)))
            .await
            .map_err(|e| format!("deleting topics {}: {e}", names.join(", ")))?;
        for r in results {
            if let Err((topic, code)) = r
                && code != rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(format!("deleting topic {topic}: {code}"));
            }
        }
        Ok(())
    }

    /// Deletes the consumer group (its committed offsets); a group that does not exist is fine.
    /// The broker refuses while the group has members.
    pub async fn delete_group(&self, group: &str) -> Result<(), String> {
        let admin: AdminClient<DefaultClientContext> = self
            .config
            .create()
            .map_err(|e| format!("creating a Kafka admin client: {e}"))?;
        let results = admin
            .delete_groups(
                &[group],
                &AdminOptions::new().operation_timeout(Some(REQUEST)),
            )
            .await
            .map_err(|e| format!("deleting consumer group {group}: {e}"))?;
        for r in results {
            if let Err((_, code)) = r
                && code != rdkafka::types::RDKafkaErrorCode::GroupIdNotFound
            {
                return Err(format!("deleting consumer group {group}: {code}"));
            }
        }
        Ok(())
    }
}

/// What is wrong with a StreamApp's topics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicProblem {
    /// A topic the processors read or write does not exist (`field` names it in the spec).
    Missing { topic: String, field: &'static str },
    /// The input's partition count changed since the changelog was made: dedup ids would move
    /// to other partitions, whose stores never saw them.
    InputPartitionsChanged {
        input: String,
        partitions: usize,
        changelog: String,
        changelog_partitions: usize,
    },
}

impl TopicProblem {
    pub fn describe(&self) -> String {
        match self {
            TopicProblem::Missing { topic, field } => {
                format!("topic {topic} ({field}) does not exist: create it")
            }
            TopicProblem::InputPartitionsChanged {
                input,
                partitions,
                changelog,
                changelog_partitions,
            } => format!(
                "input topic {input} has {partitions} partitions but the changelog {changelog} was made for \
                 {changelog_partitions}: records of a command id now land on other partitions than before, whose \
                 stores never saw them. Restore {input}'s partition count, or reset the StreamApp (annotation \
                 streamapp.dev/reset) to start over with empty stores"
            ),
        }
    }
}

/// The problems of the topics in `view` for `app` (whose changelog is `changelog`).
pub fn topic_problems(app: &StreamApp, view: &TopicsView, changelog: &str) -> Vec<TopicProblem> {
    let topology = &app.spec.topology;
    let mut wanted = vec![
        (&topology.input_topic, "spec.topology.inputTopic"),
        (&topology.output_topic, "spec.topology.outputTopic"),
        (&topology.dead_letter_topic, "spec.topology.deadLetterTopic"),
    ];
    if let Some(d) = &topology.duplicates_topic {
        wanted.push((d, "spec.topology.duplicatesTopic"));
    }
    let mut problems: Vec<TopicProblem> = wanted
        .into_iter()
        .filter(|(topic, _)| view.partitions.get(*topic).copied().flatten().is_none())
        .map(|(topic, field)| TopicProblem::Missing {
            topic: topic.clone(),
            field,
        })
        .collect();
    let input = view
        .partitions
        .get(&topology.input_topic)
        .copied()
        .flatten();
    let changelog_partitions = view.partitions.get(changelog).copied().flatten();
    if let (Some(partitions), Some(changelog_partitions)) = (input, changelog_partitions)
        && partitions != changelog_partitions
    {
        problems.push(TopicProblem::InputPartitionsChanged {
            input: topology.input_topic.clone(),
            partitions,
            changelog: changelog.to_string(),
            changelog_partitions,
        });
    }
    problems
}

/// Records of the input not processed yet: end offsets minus the group's committed offsets
/// (a partition the group never committed on counts from 0, as the processors start at the
/// earliest offset).
pub fn lag(ends: &[i64], committed: &[Option<i64>]) -> i64 {
    ends.iter()
        .zip(committed.iter().chain(std::iter::repeat(&None)))
        .map(|(end, c)| (end - c.unwrap_or(0)).max(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    fn view(topics: &[(&str, Option<usize>)]) -> TopicsView {
        TopicsView {
            partitions: topics.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
        }
    }

    #[test]
    fn missing_topics_are_named_with_their_field() {
        let app = app();
        let topology = &app.spec.topology;
        let v = view(&[
            (&topology.input_topic, Some(4)),
            (&topology.output_topic, None),
            (&topology.dead_letter_topic, Some(1)),
        ]);
        let problems = topic_problems(&app, &v, "shop.orders-dedup-changelog");
        assert_eq!(
            problems,
            [TopicProblem::Missing {
                topic: topology.output_topic.clone(),
                field: "spec.topology.outputTopic"
            }]
        );
        assert!(problems[0].describe().contains("does not exist"));
    }

    #[test]
    fn an_input_with_more_partitions_than_its_changelog_is_a_problem_that_says_why() {
        let app = app();
        let t = &app.spec.topology;
        let v = view(&[
            (&t.input_topic, Some(6)),
            (&t.output_topic, Some(6)),
            (&t.dead_letter_topic, Some(1)),
            ("shop.orders-dedup-changelog", Some(4)),
        ]);
        let problems = topic_problems(&app, &v, "shop.orders-dedup-changelog");
        assert_eq!(problems.len(), 1, "{problems:?}");
        let text = problems[0].describe();
        assert!(
            text.contains("6 partitions") && text.contains("made for 4"),
            "{text}"
        );
    }

    #[test]
    fn lag_counts_what_is_not_committed_yet() {
        assert_eq!(lag(&[10, 20, 0], &[Some(10), Some(5), None]), 15);
        assert_eq!(
            lag(&[7, 3], &[None, None]),
            10,
            "nothing committed: from the start"
        );
        assert_eq!(lag(&[], &[]), 0);
    }

    #[test]
    fn reset_targets_are_earliest_latest_or_a_time() {
        assert_eq!(ResetTarget::parse("earliest"), Ok(ResetTarget::Earliest));
        assert_eq!(ResetTarget::parse("latest"), Ok(ResetTarget::Latest));
        assert_eq!(
            ResetTarget::parse("2026-12-01T10:00:00Z"),
            Ok(ResetTarget::Time(1_796_119_200_000))
        );
        assert!(
            ResetTarget::parse("yesterday")
                .unwrap_err()
                .contains("RFC 3339")
        );
    }
}
