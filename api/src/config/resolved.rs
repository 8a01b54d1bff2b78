//! The processor's configuration checked and resolved once: durations, sizes, the topology, the
//! RocksDB settings and the group's timing as typed values, or every error at once, each
//! naming its field. [`ProcessorConfig::validate`] is the same rules for callers that only
//! check (the operator, before it rolls a configuration out).

use std::path::PathBuf;
use std::time::Duration;

use super::{
    ConfigErrors, DEFAULT_PRODUCER_MESSAGE_MAX_BYTES, KafkaClient, MAX_PROCESSING_THREADS,
    ProcessorConfig, RECORD_OVERHEAD_BYTES, RESERVED_KAFKA_PROPERTIES, ResolvedRocksDb,
    ResolvedTopology, membership_connection,
};
use crate::units::parse_duration;

/// What the processor runs with: its configuration file, checked, with every value typed.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedConfig {
    pub application_id: String,
    /// The bootstrap servers and the user's client properties (none of them reserved).
    pub kafka: KafkaClient,
    pub topology: ResolvedTopology,
    /// The compacted topic the dedup store is backed by ([`ProcessorConfig::changelog_topic`]).
    pub changelog_topic: String,
    /// The internal topic of the route stage, when the topology repartitions
    /// ([`ProcessorConfig::repartition_topic`]).
    pub repartition_topic: Option<String>,
    pub rocksdb: ResolvedRocksDb,
    pub state_dir: PathBuf,
    pub wal_dir: Option<PathBuf>,
    pub http_port: u16,
    pub drain_timeout: Duration,
    pub liveness_timeout: Duration,
    pub group: ResolvedGroup,
    pub processing_threads: u32,
}

/// The group settings resolved (see [`super::GroupSettings`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedGroup {
    /// 0: librdkafka's membership, no standbys; more: the processor's own membership.
    pub standby_replicas: u32,
    pub acceptable_recovery_lag: u64,
    pub timing: GroupTiming,
}

/// The state-aware membership's timing, from the settings and the client properties that
/// librdkafka's membership would use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupTiming {
    /// `session.timeout.ms` (45 s by default).
    pub session_timeout: Duration,
    /// `heartbeat.interval.ms` (3 s by default).
    pub heartbeat_interval: Duration,
    /// `max.poll.interval.ms` (5 min by default): how long a rebalance waits for members.
    pub rebalance_timeout: Duration,
    pub probing_rebalance_interval: Duration,
}

impl ProcessorConfig {
    /// Checks the whole configuration and resolves it, or tells every value that cannot be
    /// used, each with its field. A check between fields runs only when each of them is
    /// usable on its own, so an error is not reported twice.
    pub fn resolve(&self) -> Result<ResolvedConfig, ConfigErrors> {
        let mut errors = ConfigErrors::default();
        if self.application_id.is_empty()
            || !self
                .application_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            errors.push(
                "applicationId",
                "must be non-empty and use only letters, digits, '.', '_' and '-'",
            );
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            errors.push("kafka.bootstrapServers", "must not be empty");
        }
        for key in self.kafka.properties.keys() {
            if RESERVED_KAFKA_PROPERTIES.contains(&key.as_str()) {
                errors.push(
                    &format!("kafka.properties.{key}"),
                    "is set by the processor for exactly-once processing and cannot be overridden",
                );
            }
        }
        let producer_max = self.producer_message_max_bytes(&mut errors);
        let timing = self.group_timing(&mut errors);
        if self.group.standby_replicas > 0
            && let Err((key, why)) =
                membership_connection(|k| self.kafka.properties.get(k).map(String::as_str))
        {
            errors.push(&format!("kafka.properties.{key}"), why);
        }
        let topology = errors.absorb(self.topology.resolve());
        self.check_internal_topics_unused(&mut errors);
        if let (Some(topology), Some(producer_max)) = (&topology, producer_max)
            && topology.max_value_bytes + RECORD_OVERHEAD_BYTES > producer_max
        {
            errors.push(
                "topology.maxValueSize",
                format!(
                    "{} bytes does not fit the producer's message.max.bytes ({producer_max}) with \
                     {RECORD_OVERHEAD_BYTES} bytes for key and headers: use at most {} bytes, or raise \
                     kafka.properties.message.max.bytes (and the topics' max.message.bytes)",
                    topology.max_value_bytes,
                    producer_max.saturating_sub(RECORD_OVERHEAD_BYTES)
                ),
            );
        }
        let rocksdb = errors.absorb(self.rocksdb.resolve());
        if self.state_dir.is_empty() {
            errors.push("stateDir", "must not be empty");
        }
        let drain_timeout = errors.check("drainTimeout", parse_duration(&self.drain_timeout));
        let liveness_timeout =
            errors.check("livenessTimeout", positive_duration(&self.liveness_timeout));
        if !(1..=MAX_PROCESSING_THREADS).contains(&self.processing_threads) {
            errors.push(
                "processingThreads",
                format!("must be from 1 to {MAX_PROCESSING_THREADS}"),
            );
        }
        let (Some(topology), Some(rocksdb), Some(timing), Some(drain_timeout), Some(liveness)) =
            (topology, rocksdb, timing, drain_timeout, liveness_timeout)
        else {
            return Err(errors);
        };
        errors.or_ok(ResolvedConfig {
            application_id: self.application_id.clone(),
            kafka: self.kafka.clone(),
            topology,
            changelog_topic: self.changelog_topic(),
            repartition_topic: self.repartition_topic(),
            rocksdb,
            state_dir: PathBuf::from(&self.state_dir),
            wal_dir: self.wal_dir.as_ref().map(PathBuf::from),
            http_port: self.http_port,
            drain_timeout,
            liveness_timeout: liveness,
            group: ResolvedGroup {
                standby_replicas: self.group.standby_replicas,
                acceptable_recovery_lag: self.group.acceptable_recovery_lag,
                timing,
            },
            processing_threads: self.processing_threads,
        })
    }

    /// Checks the whole configuration by the rules of [`ProcessorConfig::resolve`], for
    /// callers that do not run it.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        self.resolve().map(drop)
    }

    /// The membership's timing (see [`GroupTiming`]), or `None` with the errors noted.
    fn group_timing(&self, errors: &mut ConfigErrors) -> Option<GroupTiming> {
        let mut millis = |key: &str, default: u64| match self.kafka.properties.get(key) {
            None => Some(Duration::from_millis(default)),
            Some(v) => errors.check(
                &format!("kafka.properties.{key}"),
                v.parse()
                    .map(Duration::from_millis)
                    .map_err(|_| "must be a whole number of milliseconds"),
            ),
        };
        let session_timeout = millis("session.timeout.ms", 45_000);
        let heartbeat_interval = millis("heartbeat.interval.ms", 3_000);
        let rebalance_timeout = millis("max.poll.interval.ms", 300_000);
        let probing_rebalance_interval = errors.check(
            "group.probingRebalanceInterval",
            positive_duration(&self.group.probing_rebalance_interval),
        );
        Some(GroupTiming {
            session_timeout: session_timeout?,
            heartbeat_interval: heartbeat_interval?,
            rebalance_timeout: rebalance_timeout?,
            probing_rebalance_interval: probing_rebalance_interval?,
        })
    }

    /// The topology's topics must not be the application's own internal topics: outputs
    /// written into its changelog would become its state, into its repartition topic its
    /// input. Both names are refused whether or not the topology repartitions now (a change
    /// of `topology.dedupId` starts it).
    fn check_internal_topics_unused(&self, errors: &mut ConfigErrors) {
        let [changelog, repartition] = super::internal_topics(&self.application_id);
        let t = &self.topology;
        let topics = [
            ("topology.inputTopic", Some(&t.input_topic)),
            ("topology.outputTopic", Some(&t.output_topic)),
            ("topology.deadLetterTopic", Some(&t.dead_letter_topic)),
            ("topology.duplicatesTopic", t.duplicates_topic.as_ref()),
        ];
        for (field, topic) in topics {
            let Some(topic) = topic else { continue };
            let role = if *topic == changelog {
                "changelog"
            } else if *topic == repartition {
                "repartition topic"
            } else {
                continue;
            };
            errors.push(
                field,
                format!(
                    "{topic} is this application's own {role}, which only the processor writes \
                     (its state); choose another topic"
                ),
            );
        }
    }

    /// The largest record the producer sends: `kafka.properties.message.max.bytes`, or
    /// librdkafka's default; `None` with the error noted.
    fn producer_message_max_bytes(&self, errors: &mut ConfigErrors) -> Option<u64> {
        match self.kafka.properties.get("message.max.bytes") {
            None => Some(DEFAULT_PRODUCER_MESSAGE_MAX_BYTES),
            Some(v) => errors.check(
                "kafka.properties.message.max.bytes",
                v.trim()
                    .parse()
                    .map_err(|_| format!("{v:?} is not a number of bytes")),
            ),
        }
    }
}

/// A duration that must not be zero.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("must be greater than 0".into()),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests;
