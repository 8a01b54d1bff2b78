//! The processor's configuration: the pipeline (topics, dedup id, windows), the Kafka client and
//! the RocksDB tuning.
//!
//! The same types appear in the `StreamApp` spec (users write them) and in the processor's
//! configuration file (the operator renders them into a ConfigMap, the processor reads it), so
//! a knob means the same thing everywhere. Defaults live beside the types.
//!
//! - `topology.rs`: the pipeline: topics, dedup id, window, record limits;
//! - `kafka.rs`: the Kafka client settings and the properties the processor keeps for itself;
//! - `rocksdb.rs`: the stores' tuning and the container memory it implies;
//! - `internal_topics.rs`: the names of the topics the processor creates for itself;
//! - here: the processor's configuration file, its group settings and its validation.

mod internal_topics;
mod kafka;
mod rocksdb;
mod topology;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::parse_duration;

pub use internal_topics::{changelog_topic, internal_topics, repartition_topic};
pub use kafka::{
    KafkaClient, MembershipConnection, RESERVED_KAFKA_PROPERTIES, SaslMechanism, group_member,
    membership_connection, pod_of_group_member,
};
pub use rocksdb::{
    CompactionStyle, Compression, PROCESS_BASE_BYTES, ResolvedRocksDb, RocksDbProfile,
    RocksDbTuning, THREAD_CLIENT_BYTES, VerificationTuning, WalRecoveryMode, WalTuning,
    process_overhead_bytes,
};
pub use topology::{
    DEFAULT_PRODUCER_MESSAGE_MAX_BYTES, DedupId, DedupIdSource, RECORD_OVERHEAD_BYTES, Repartition,
    ResolvedTopology, Topology, check_topic_name, default_commit_interval,
    default_max_record_attempts, default_max_skew, default_max_value_size, default_retention,
};

/// The processor's configuration file (`processor.yaml` in the ConfigMap the operator writes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorConfig {
    /// Names the consumer group, the changelog topic (`<applicationId>-dedup-changelog`) and
    /// the transactional ids.
    pub application_id: String,
    pub kafka: KafkaClient,
    pub topology: Topology,
    #[serde(default)]
    pub rocksdb: RocksDbTuning,
    /// Where task stores, checkpoints, quarantines and the health file live.
    #[serde(default = "default_state_dir")]
    pub state_dir: String,
    /// Optional separate directory (volume) for RocksDB's write-ahead logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_dir: Option<String>,
    /// Port of /metrics, /healthz, /readyz and the drain endpoint.
    #[serde(default = "default_http_port")]
    pub http_port: u16,
    /// How long a drain may take before the processor gives up and exits anyway.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: String,
    /// `/healthz` fails once the processing loop has made no progress (no poll, no commit,
    /// no restore step) for this long: a stuck loop gets the container restarted. Longer
    /// than any single blocking call of the loop (each is bounded by 30 s).
    #[serde(default = "default_liveness_timeout")]
    pub liveness_timeout: String,
    /// Standby replicas and the state-aware group membership (ADR 0001).
    #[serde(default)]
    pub group: GroupSettings,
    /// Processing threads in the process (Kafka Streams' `num.stream.threads`): each is a
    /// member of the consumer group of its own, with its own transactional producer and its
    /// own share of the tasks, so a pod with several partitions uses several cores. The
    /// stores share one block cache and one memtable budget whatever the number.
    #[serde(
        default = "default_processing_threads",
        skip_serializing_if = "is_one_thread"
    )]
    pub processing_threads: u32,
}

/// The most processing threads a process runs.
pub const MAX_PROCESSING_THREADS: u32 = 16;

pub fn default_processing_threads() -> u32 {
    1
}
fn is_one_thread(threads: &u32) -> bool {
    *threads == 1
}

/// How the processes of one application share the tasks.
///
/// With `standbyReplicas` 0 the processor takes part in its consumer group through librdkafka
/// (range assignor, static membership). With 1 or more it runs its own membership with
/// StreamApp's state-aware assignor (ADR 0001): an active task stays on a pod whose store is
/// caught up, a move to a pod without the state first warms a copy up there, and each task
/// keeps that many standby copies on other pods, tailing its changelog with read_committed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSettings {
    /// Warm copies of each task's store on other pods (capped at pods − 1).
    #[serde(default)]
    pub standby_replicas: u32,
    /// A store at most this many changelog records behind counts as caught up: a task moves
    /// only to a pod whose copy is (Kafka Streams' `acceptable.recovery.lag`).
    #[serde(default = "default_acceptable_recovery_lag")]
    pub acceptable_recovery_lag: u64,
    /// While a warm-up is in progress the group leader rebalances this often, to move the
    /// task once its copy caught up (Kafka Streams' `probing.rebalance.interval.ms`).
    #[serde(default = "default_probing_rebalance_interval")]
    pub probing_rebalance_interval: String,
}

impl Default for GroupSettings {
    fn default() -> Self {
        GroupSettings {
            standby_replicas: 0,
            acceptable_recovery_lag: default_acceptable_recovery_lag(),
            probing_rebalance_interval: default_probing_rebalance_interval(),
        }
    }
}

pub fn default_acceptable_recovery_lag() -> u64 {
    10_000
}
pub fn default_probing_rebalance_interval() -> String {
    "10m".into()
}

pub fn default_state_dir() -> String {
    "/var/lib/streamapp".into()
}
pub fn default_http_port() -> u16 {
    8080
}
pub fn default_drain_timeout() -> String {
    "60s".into()
}
pub fn default_liveness_timeout() -> String {
    "60s".into()
}

/// A configuration value that cannot be used, with the field it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn field(field: &str, message: impl ToString) -> Self {
        ConfigError {
            field: field.into(),
            message: message.to_string(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid configuration: {}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

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
    /// The membership's timing (see [`GroupTiming`]); errors name the field.
    pub fn group_timing(&self) -> Result<GroupTiming, ConfigError> {
        let millis = |key: &str, default: u64| -> Result<Duration, ConfigError> {
            match self.kafka.properties.get(key) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => v.parse().map(Duration::from_millis).map_err(|_| {
                    ConfigError::field(
                        &format!("kafka.properties.{key}"),
                        "must be a whole number of milliseconds",
                    )
                }),
            }
        };
        let probing = parse_duration(&self.group.probing_rebalance_interval)
            .map_err(|e| ConfigError::field("group.probingRebalanceInterval", e))?;
        if probing.is_zero() {
            return Err(ConfigError::field(
                "group.probingRebalanceInterval",
                "must be greater than 0",
            ));
        }
        Ok(GroupTiming {
            session_timeout: millis("session.timeout.ms", 45_000)?,
            heartbeat_interval: millis("heartbeat.interval.ms", 3_000)?,
            rebalance_timeout: millis("max.poll.interval.ms", 300_000)?,
            probing_rebalance_interval: probing,
        })
    }

    /// Checks the whole configuration. Errors name the field.
    pub fn validate(&self) -> Result<(ResolvedTopology, ResolvedRocksDb), ConfigError> {
        if self.application_id.is_empty()
            || !self
                .application_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(ConfigError::field(
                "applicationId",
                "must be non-empty and use only letters, digits, '.', '_' and '-'",
            ));
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::field(
                "kafka.bootstrapServers",
                "must not be empty",
            ));
        }
        for key in self.kafka.properties.keys() {
            if RESERVED_KAFKA_PROPERTIES.contains(&key.as_str()) {
                return Err(ConfigError::field(
                    &format!("kafka.properties.{key}"),
                    "is set by the processor for exactly-once processing and cannot be overridden",
                ));
            }
        }
        if self.state_dir.is_empty() {
            return Err(ConfigError::field("stateDir", "must not be empty"));
        }
        parse_duration(&self.drain_timeout).map_err(|e| ConfigError::field("drainTimeout", e))?;
        let liveness = parse_duration(&self.liveness_timeout)
            .map_err(|e| ConfigError::field("livenessTimeout", e))?;
        if liveness.is_zero() {
            return Err(ConfigError::field(
                "livenessTimeout",
                "must be greater than 0",
            ));
        }
        self.group_timing()?;
        if !(1..=MAX_PROCESSING_THREADS).contains(&self.processing_threads) {
            return Err(ConfigError::field(
                "processingThreads",
                format!("must be from 1 to {MAX_PROCESSING_THREADS}"),
            ));
        }
        if self.processing_threads > 1 && self.group.standby_replicas > 0 {
            return Err(ConfigError::field(
                "processingThreads",
                "must be 1 with standby replicas: the state-aware membership places one member \
                 per pod (a standby must not share a pod, and so a state directory, with its \
                 active task)",
            ));
        }
        if self.group.standby_replicas > 0
            && let Err((key, why)) =
                membership_connection(|k| self.kafka.properties.get(k).map(String::as_str))
        {
            return Err(ConfigError::field(&format!("kafka.properties.{key}"), why));
        }
        let topology = self.topology.resolve()?;
        self.check_internal_topics_unused()?;
        let producer_max = self.producer_message_max_bytes()?;
        if topology.max_value_bytes + RECORD_OVERHEAD_BYTES > producer_max {
            return Err(ConfigError::field(
                "topology.maxValueSize",
                format!(
                    "{} bytes does not fit the producer's message.max.bytes ({producer_max}) with \
                     {RECORD_OVERHEAD_BYTES} bytes for key and headers: use at most {} bytes, or raise \
                     kafka.properties.message.max.bytes (and the topics' max.message.bytes)",
                    topology.max_value_bytes,
                    producer_max.saturating_sub(RECORD_OVERHEAD_BYTES)
                ),
            ));
        }
        Ok((topology, self.rocksdb.resolve()?))
    }

    /// The topology's topics must not be the application's own internal topics: outputs
    /// written into its changelog would become its state, into its repartition topic its
    /// input. Both names are refused whether or not the topology repartitions now (a change
    /// of `topology.dedupId` starts it).
    fn check_internal_topics_unused(&self) -> Result<(), ConfigError> {
        let [changelog, repartition] = internal_topics(&self.application_id);
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
            return Err(ConfigError::field(
                field,
                format!(
                    "{topic} is this application's own {role}, which only the processor writes \
                     (its state); choose another topic"
                ),
            ));
        }
        Ok(())
    }

    /// The largest record the producer sends: `kafka.properties.message.max.bytes`, or
    /// librdkafka's default.
    pub fn producer_message_max_bytes(&self) -> Result<u64, ConfigError> {
        match self.kafka.properties.get("message.max.bytes") {
            None => Ok(DEFAULT_PRODUCER_MESSAGE_MAX_BYTES),
            Some(v) => v.trim().parse().map_err(|_| {
                ConfigError::field(
                    "kafka.properties.message.max.bytes",
                    format!("{v:?} is not a number of bytes"),
                )
            }),
        }
    }

    /// The compacted topic the dedup store is backed by ([`changelog_topic`]).
    pub fn changelog_topic(&self) -> String {
        changelog_topic(&self.application_id)
    }

    /// The internal topic the first stage writes records keyed by their dedup id to, when the
    /// topology repartitions ([`Topology::repartitions`], [`repartition_topic`]).
    pub fn repartition_topic(&self) -> Option<String> {
        self.topology
            .repartitions()
            .then(|| repartition_topic(&self.application_id))
    }
}

#[cfg(test)]
mod tests {
    use super::topology::tests::topology;
    use super::*;

    #[test]
    fn a_topic_that_is_the_applications_own_internal_topic_is_refused_naming_the_field() {
        for (internal, role) in [
            ("app-dedup-changelog", "changelog"),
            ("app-dedup-repartition", "repartition topic"),
        ] {
            let mut c = processor_config(&[]);
            c.topology.output_topic = internal.into();
            let e = c.validate().unwrap_err();
            assert_eq!(e.field, "topology.outputTopic");
            assert!(e.message.contains(role), "{}", e.message);
            let mut c = processor_config(&[]);
            c.topology.duplicates_topic = Some(internal.into());
            assert_eq!(c.validate().unwrap_err().field, "topology.duplicatesTopic");
        }
        let mut c = processor_config(&[]);
        c.topology.output_topic = "other-app-dedup-changelog".into();
        c.validate()
            .expect("another application's internal topic is refused at admission (a CEL rule of the CRD), not here");
    }

    fn processor_config(properties: &[(&str, &str)]) -> ProcessorConfig {
        ProcessorConfig {
            application_id: "app".into(),
            kafka: KafkaClient {
                bootstrap_servers: "k:9092".into(),
                properties: properties
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            topology: topology(),
            rocksdb: RocksDbTuning::default(),
            state_dir: default_state_dir(),
            wal_dir: None,
            http_port: 8080,
            drain_timeout: default_drain_timeout(),
            liveness_timeout: default_liveness_timeout(),
            group: GroupSettings::default(),
            processing_threads: 1,
        }
    }

    #[test]
    fn standbys_take_their_timing_from_the_client_properties_and_refuse_what_the_membership_cannot_speak()
     {
        let mut c = processor_config(&[("session.timeout.ms", "6000")]);
        c.group.standby_replicas = 1;
        let t = c.group_timing().unwrap();
        assert_eq!(t.session_timeout, Duration::from_secs(6));
        assert_eq!(t.heartbeat_interval, Duration::from_secs(3));
        assert_eq!(t.rebalance_timeout, Duration::from_secs(300));
        assert_eq!(t.probing_rebalance_interval, Duration::from_secs(600));
        assert!(c.validate().is_ok());
        let mut with = |pairs: &[(&str, &str)]| {
            c.kafka.properties = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            c.group.standby_replicas = 1;
            let standbys = c.validate().map(|_| ()).map_err(|e| e.field);
            c.group.standby_replicas = 0;
            assert!(
                c.validate().is_ok(),
                "librdkafka's membership takes {pairs:?}"
            );
            standbys
        };
        assert_eq!(
            with(&[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512")
            ]),
            Ok(())
        );
        assert_eq!(with(&[("security.protocol", "SSL")]), Ok(()));
        assert_eq!(
            with(&[("security.protocol", "SASL_SSL")]),
            Err("kafka.properties.sasl.mechanism".into()),
            "librdkafka's default mechanism is GSSAPI"
        );
        assert_eq!(
            with(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanisms", "OAUTHBEARER")
            ]),
            Err("kafka.properties.sasl.mechanisms".into())
        );
        assert_eq!(
            with(&[
                ("security.protocol", "SSL"),
                ("ssl.endpoint.identification.algorithm", "none")
            ]),
            Err("kafka.properties.ssl.endpoint.identification.algorithm".into())
        );
        assert_eq!(
            with(&[("ssl.keystore.location", "/k.p12")]),
            Err("kafka.properties.ssl.keystore.location".into())
        );
        c.kafka.properties.clear();
        c.group.standby_replicas = 1;
        c.group.probing_rebalance_interval = "0s".into();
        assert_eq!(
            c.validate().unwrap_err().field,
            "group.probingRebalanceInterval"
        );
    }

    #[test]
    fn processing_threads_are_one_to_sixteen_and_one_with_standbys() {
        let mut c = processor_config(&[]);
        let yaml = serde_yaml::to_string(&c).unwrap();
        assert!(
            !yaml.contains("processingThreads"),
            "one thread (the default) is not written, so existing files stay as they were"
        );
        for (threads, ok) in [(0, false), (1, true), (4, true), (16, true), (17, false)] {
            c.processing_threads = threads;
            assert_eq!(c.validate().is_ok(), ok, "{threads} threads");
        }
        c.processing_threads = 2;
        c.group.standby_replicas = 1;
        assert_eq!(c.validate().unwrap_err().field, "processingThreads");
        c.group.standby_replicas = 0;
        let read: ProcessorConfig =
            serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
        assert_eq!(read.processing_threads, 2);
    }

    #[test]
    fn default_topology_resolves_to_one_hour_100ms_and_limits_that_fit_librdkafka() {
        let r = topology().resolve().unwrap();
        assert_eq!(r.retention, Duration::from_secs(3600));
        assert_eq!(r.commit_interval, Duration::from_millis(100));
        assert_eq!(r.max_value_bytes, 900_000);
        assert!(
            r.max_value_bytes + RECORD_OVERHEAD_BYTES <= DEFAULT_PRODUCER_MESSAGE_MAX_BYTES,
            "a record of the default maximum size, with its key and headers, fits librdkafka's message.max.bytes"
        );
        assert_eq!(r.max_skew, Duration::from_secs(300));
        assert_eq!(r.max_record_attempts, 3);
        processor_config(&[]).validate().unwrap();
    }

    #[test]
    fn records_are_repartitioned_unless_the_id_is_the_key_or_the_user_says_never() {
        let mut config = processor_config(&[]);
        assert_eq!(config.topology.dedup_id.source, DedupIdSource::Key);
        assert_eq!(config.repartition_topic(), None, "keyed by the id already");
        config.topology.dedup_id = DedupId {
            source: DedupIdSource::JsonPointer,
            header: None,
            json_pointer: Some("/id".into()),
        };
        assert_eq!(
            config.repartition_topic().as_deref(),
            Some(format!("{}-dedup-repartition", config.application_id).as_str())
        );
        config.topology.repartition = Repartition::Never;
        assert_eq!(config.repartition_topic(), None);
    }

    #[test]
    fn a_max_value_size_the_producer_cannot_send_is_refused_naming_the_field() {
        let mut config = processor_config(&[]);
        config.topology.max_value_size = "1Mi".into();
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "topology.maxValueSize");
        assert!(e.message.contains("message.max.bytes (1000000)"), "{e}");
        // Raising the producer's limit makes room for it.
        let mut config = processor_config(&[("message.max.bytes", "2000000")]);
        config.topology.max_value_size = "1Mi".into();
        config.validate().unwrap();
        let config = processor_config(&[("message.max.bytes", "lots")]);
        assert_eq!(
            config.validate().unwrap_err().field,
            "kafka.properties.message.max.bytes"
        );
    }

    #[test]
    fn the_kip_848_group_protocol_and_incremental_assignors_are_refused() {
        for (key, value) in [
            ("group.protocol", "consumer"),
            ("group.remote.assignor", "uniform"),
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("auto.offset.reset", "latest"),
            ("acks", "1"),
        ] {
            let e = processor_config(&[(key, value)]).validate().unwrap_err();
            assert_eq!(e.field, format!("kafka.properties.{key}"));
        }
    }

    #[test]
    fn reserved_kafka_properties_are_refused() {
        let config = processor_config(&[("isolation.level", "read_uncommitted")]);
        assert_eq!(
            config.validate().unwrap_err().field,
            "kafka.properties.isolation.level"
        );
    }
}
