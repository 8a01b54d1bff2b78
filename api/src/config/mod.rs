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
//! - `resolved.rs`: the whole configuration checked and resolved into typed values, once;
//! - `errors.rs`: what is wrong with a configuration, field by field;
//! - here: the processor's configuration file and its group settings.

mod errors;
mod internal_topics;
mod kafka;
mod resolved;
mod rocksdb;
mod topology;

use serde::{Deserialize, Serialize};

pub use errors::{ConfigError, ConfigErrors};
pub use internal_topics::{changelog_topic, internal_topics, repartition_topic};

pub use kafka::{
    CLIENT_DEFAULTS, DEFAULT_TRANSACTION_TIMEOUT, KafkaClient, MembershipConnection,
    RESERVED_KAFKA_PROPERTIES, SaslMechanism, group_member, membership_connection,
    pod_of_group_member, transaction_timeout, transactional_id,
};
pub use resolved::{GroupTiming, ResolvedConfig, ResolvedGroup};
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

impl ProcessorConfig {
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
pub(super) mod tests {
    use super::topology::tests::topology;
    use super::*;

    /// A valid configuration with these client properties.
    pub(in crate::config) fn processor_config(properties: &[(&str, &str)]) -> ProcessorConfig {
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
    fn one_processing_thread_is_not_written_so_existing_files_stay_as_they_were() {
        let mut c = processor_config(&[]);
        let yaml = serde_yaml::to_string(&c).unwrap();
        assert!(!yaml.contains("processingThreads"), "{yaml}");
        c.processing_threads = 2;
        let read: ProcessorConfig =
            serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
        assert_eq!(read.processing_threads, 2);
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
}
