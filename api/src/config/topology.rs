//! What the processor deduplicates and where records go: topics, the dedup id, the window,
//! and the limits records are checked against.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigErrors;
use crate::units::{parse_duration, parse_quantity};

/// What the processor deduplicates and where records go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// Topic the commands are read from (read_committed). Each partition is one task with its
    /// own state store.
    #[schemars(length(min = 1, max = 249), regex(pattern = r"^[a-zA-Z0-9._-]+$"))]
    pub input_topic: String,
    /// Topic every first occurrence of an id is written to.
    #[schemars(length(min = 1, max = 249), regex(pattern = r"^[a-zA-Z0-9._-]+$"))]
    pub output_topic: String,
    /// Optional topic repeated ids are written to (they are counted either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 249), regex(pattern = r"^[a-zA-Z0-9._-]+$"))]
    pub duplicates_topic: Option<String>,
    /// Topic for records that cannot be processed (no dedup id, undecodable payload, too
    /// large, stamped too far in the future, failing every attempt), with a
    /// `streamapp.dlq.reason` header saying why. Nothing is dropped silently.
    #[schemars(length(min = 1, max = 249), regex(pattern = r"^[a-zA-Z0-9._-]+$"))]
    pub dead_letter_topic: String,
    /// Where the dedup id of a record is found.
    #[serde(default)]
    pub dedup_id: DedupId,
    /// Whether records are re-keyed by their dedup id before deduplication, so that a repeat
    /// is caught whichever input partition it arrives on. `Auto` (the default): unless the id
    /// is the record key, a first stage writes every record keyed by its id to the internal
    /// topic `<applicationId>-dedup-repartition`, and the dedup stage reads that topic, inside
    /// the same transactions. `Never`: the input is trusted to be keyed by the dedup id
    /// (every repeat on the partition of its first occurrence); records whose key is not
    /// their id are counted (metric `streamapp_processor_miskeyed_records_total`, the status) but not
    /// moved, so a repeat on another partition is output again.
    #[serde(default)]
    pub repartition: Repartition,
    /// How long an id is remembered, by record time (Go duration, e.g. `1h`, `30m`).
    #[serde(default = "default_retention")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub retention: String,
    /// How often the Kafka transaction is committed (Go duration). Output becomes visible to
    /// read_committed consumers at each commit.
    #[serde(default = "default_commit_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub commit_interval: String,
    /// Records whose value is larger than this go to the dead-letter topic, as metadata only
    /// (reason, source offset and size headers; the original stays in the input topic). Bytes,
    /// Kubernetes quantity notation. With the record's key and headers it must fit the
    /// producer's `message.max.bytes` (librdkafka's default 1,000,000, settable in
    /// `kafka.properties`): at most `message.max.bytes` minus 64Ki. At start-up the processor
    /// also checks it against the broker's `message.max.bytes` and the output, duplicates and
    /// dead-letter topics' `max.message.bytes`.
    #[serde(default = "default_max_value_size")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub max_value_size: String,
    /// How far ahead of the processor's clock a record's timestamp may be (Go duration).
    /// Records stamped later go to the dead-letter topic with reason `timestamp-too-far-ahead`
    /// instead of moving stream time: one record from the future cannot expire every id. An
    /// id is remembered for at least `retention` minus this; must be less than `retention`.
    #[serde(default = "default_max_skew")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub max_skew: String,
    /// How many times a record is tried when its processing, or writing its results, fails
    /// with an error that retrying does not fix. After the last failed attempt the record goes
    /// to the dead-letter topic (reason `processing-failed` or `produce-failed`, the error in
    /// `streamapp.dlq.error`) and the partition goes on, like Kafka Streams' processing
    /// exception handler (KIP-1033) after a bounded retry. Transient errors (a broker
    /// restarting, timeouts) are retried without limit.
    #[serde(default = "default_max_record_attempts")]
    #[schemars(range(min = 1, max = 100))]
    pub max_record_attempts: u32,
}

pub fn default_retention() -> String {
    "1h".into()
}
pub fn default_commit_interval() -> String {
    "100ms".into()
}
/// 900,000 bytes: with up to 64Ki of key and headers, a record fits librdkafka's default
/// `message.max.bytes` (1,000,000), and the broker's default (1,048,588).
pub fn default_max_value_size() -> String {
    "900k".into()
}
pub fn default_max_skew() -> String {
    "5m".into()
}
pub fn default_max_record_attempts() -> u32 {
    3
}

/// librdkafka's default `message.max.bytes`: the largest record (batch) the producer sends.
pub const DEFAULT_PRODUCER_MESSAGE_MAX_BYTES: u64 = 1_000_000;
/// Room kept beside `maxValueSize` for a record's key, headers (the input's, plus the dedup
/// id or dead-letter headers the processor adds) and the batch framing.
pub const RECORD_OVERHEAD_BYTES: u64 = 64 * 1024;

/// Where a record's dedup id comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DedupId {
    /// `Key`: the record key. `Header`: the value of the header named in `header`.
    /// `JsonPointer`: the string or number at `jsonPointer` in the JSON value.
    #[serde(default)]
    pub source: DedupIdSource,
    /// Header name, when source is `Header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// RFC 6901 pointer such as `/commandId`, when source is `JsonPointer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_pointer: Option<String>,
}

impl Default for DedupId {
    fn default() -> Self {
        DedupId {
            source: DedupIdSource::Key,
            header: None,
            json_pointer: None,
        }
    }
}

/// See [`Topology::repartition`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Repartition {
    #[default]
    Auto,
    Never,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DedupIdSource {
    #[default]
    Key,
    Header,
    JsonPointer,
}

/// The topology checked, with its durations and sizes parsed: what the processor runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedTopology {
    pub input_topic: String,
    pub output_topic: String,
    pub duplicates_topic: Option<String>,
    pub dead_letter_topic: String,
    pub dedup_id: DedupId,
    /// `repartition: Never` with an id that is not the key: the records whose key is not
    /// their id are counted (they are not moved).
    pub check_keying: bool,
    pub retention: Duration,
    pub commit_interval: Duration,
    pub max_value_bytes: u64,
    pub max_skew: Duration,
    pub max_record_attempts: u32,
}

impl Topology {
    /// Whether records go through the repartition stage: `Auto` unless the dedup id is the
    /// record key (then the input's own partitioning is by the id already).
    pub fn repartitions(&self) -> bool {
        self.repartition == Repartition::Auto && self.dedup_id.source != DedupIdSource::Key
    }

    /// Checks what the schema cannot and parses durations and sizes. The errors name their
    /// fields, all of them: a check between two fields runs only when both parsed.
    pub fn resolve(&self) -> Result<ResolvedTopology, ConfigErrors> {
        let mut errors = ConfigErrors::default();
        let retention = errors.check("topology.retention", parse_duration(&self.retention));
        let commit_interval = errors.check(
            "topology.commitInterval",
            parse_duration(&self.commit_interval),
        );
        let max_value_bytes = errors.check(
            "topology.maxValueSize",
            parse_quantity(&self.max_value_size),
        );
        let max_skew = errors.check("topology.maxSkew", parse_duration(&self.max_skew));
        if commit_interval.is_some_and(|c| c.is_zero()) {
            errors.push("topology.commitInterval", "must be greater than 0");
        }
        if let (Some(retention), Some(commit_interval)) = (retention, commit_interval)
            && retention <= commit_interval
        {
            errors.push(
                "topology.retention",
                "must be greater than topology.commitInterval",
            );
        }
        if let (Some(retention), Some(max_skew)) = (retention, max_skew)
            && max_skew >= retention
        {
            errors.push(
                "topology.maxSkew",
                "must be less than topology.retention (ids are remembered for retention minus maxSkew at least)",
            );
        }
        if !(1..=100).contains(&self.max_record_attempts) {
            errors.push("topology.maxRecordAttempts", "must be between 1 and 100");
        }
        let mut topics = vec![
            ("topology.inputTopic", &self.input_topic),
            ("topology.outputTopic", &self.output_topic),
            ("topology.deadLetterTopic", &self.dead_letter_topic),
        ];
        if let Some(d) = &self.duplicates_topic {
            topics.push(("topology.duplicatesTopic", d));
        }
        for (i, (field, topic)) in topics.iter().enumerate() {
            if let Err(why) = check_topic_name(topic) {
                errors.push(field, why);
            } else if let Some((other, _)) = topics[..i].iter().find(|(_, t)| t == topic) {
                errors.push(
                    field,
                    format!("must differ from {other} (both are {topic:?})"),
                );
            }
        }
        match self.dedup_id.source {
            DedupIdSource::Header if self.dedup_id.header.as_deref().unwrap_or("").is_empty() => {
                errors.push(
                    "topology.dedupId.header",
                    "is required when source is Header",
                );
            }
            DedupIdSource::JsonPointer
                if !self
                    .dedup_id
                    .json_pointer
                    .as_deref()
                    .unwrap_or("")
                    .starts_with('/') =>
            {
                errors.push(
                    "topology.dedupId.jsonPointer",
                    "is required when source is JsonPointer and must start with '/' (e.g. /commandId)",
                );
            }
            _ => {}
        }
        let (Some(retention), Some(commit_interval), Some(max_value_bytes), Some(max_skew)) =
            (retention, commit_interval, max_value_bytes, max_skew)
        else {
            return Err(errors);
        };
        errors.or_ok(ResolvedTopology {
            input_topic: self.input_topic.clone(),
            output_topic: self.output_topic.clone(),
            duplicates_topic: self.duplicates_topic.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
            dedup_id: self.dedup_id.clone(),
            check_keying: self.repartition == Repartition::Never
                && self.dedup_id.source != DedupIdSource::Key,
            retention,
            commit_interval,
            max_value_bytes,
            max_skew,
            max_record_attempts: self.max_record_attempts,
        })
    }
}

/// Kafka's own rule for topic names (what its admin API would refuse at creation): 1 to 249 of
/// `a-z A-Z 0-9 . _ -`, and neither `.` nor `..`. The CRD states the same rule.
pub fn check_topic_name(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() || topic.len() > 249 {
        return Err("must be 1 to 249 characters long");
    }
    if !topic
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(
            "must use only letters, digits, '.', '_' and '-' (Kafka's rule for topic names)",
        );
    }
    if topic == "." || topic == ".." {
        return Err("must not be '.' or '..'");
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::config) fn topology() -> Topology {
        Topology {
            input_topic: "in".into(),
            output_topic: "out".into(),
            duplicates_topic: Some("dups".into()),
            dead_letter_topic: "dlq".into(),
            dedup_id: DedupId::default(),
            repartition: Repartition::default(),
            retention: default_retention(),
            commit_interval: default_commit_interval(),
            max_value_size: default_max_value_size(),
            max_skew: default_max_skew(),
            max_record_attempts: default_max_record_attempts(),
        }
    }

    #[test]
    fn max_skew_must_be_less_than_the_retention() {
        let t = Topology {
            max_skew: "1h".into(),
            ..topology()
        };
        assert_eq!(t.resolve().unwrap_err().fields(), ["topology.maxSkew"]);
        let t = Topology {
            max_record_attempts: 0,
            ..topology()
        };
        assert_eq!(
            t.resolve().unwrap_err().fields(),
            ["topology.maxRecordAttempts"]
        );
    }

    #[test]
    fn retention_must_exceed_commit_interval() {
        let t = Topology {
            retention: "100ms".into(),
            max_skew: "50ms".into(),
            ..topology()
        };
        assert_eq!(t.resolve().unwrap_err().fields(), ["topology.retention"]);
        let t = Topology {
            retention: "100ms".into(),
            ..topology()
        };
        assert_eq!(
            t.resolve().unwrap_err().fields(),
            ["topology.retention", "topology.maxSkew"],
            "the default maxSkew (5m) is not less than a retention of 100ms either"
        );
    }

    #[test]
    fn topics_must_be_distinct() {
        let t = Topology {
            output_topic: "in".into(),
            ..topology()
        };
        let errors = t.resolve().unwrap_err();
        let [e] = errors.iter().collect::<Vec<_>>()[..] else {
            panic!("one error: {errors}")
        };
        assert_eq!(e.field, "topology.outputTopic");
        assert!(e.message.contains("topology.inputTopic"), "{e}");
    }

    #[test]
    fn topic_names_follow_kafkas_rule() {
        for bad in [
            "",
            ".",
            "..",
            "orders events",
            "orders/v1",
            &"x".repeat(250),
        ] {
            let t = Topology {
                output_topic: bad.to_string(),
                ..topology()
            };
            assert_eq!(
                t.resolve().unwrap_err().fields(),
                ["topology.outputTopic"],
                "{bad:?}"
            );
        }
        for good in ["orders.v1", "orders_dedup-2", "...", &"x".repeat(249)] {
            assert_eq!(check_topic_name(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn header_source_needs_a_header_name() {
        let t = Topology {
            dedup_id: DedupId {
                source: DedupIdSource::Header,
                header: None,
                json_pointer: None,
            },
            ..topology()
        };
        assert_eq!(
            t.resolve().unwrap_err().fields(),
            ["topology.dedupId.header"]
        );
    }
}
