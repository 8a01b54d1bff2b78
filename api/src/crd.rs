//! The `StreamApp` custom resource (`streamapp.dev/v1alpha1`).
//!
//! Doc comments here are written for users: they become the CRD's field descriptions, shown by
//! `kubectl explain streamapp.spec`. CEL rules refuse bad specs at `kubectl apply`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{RocksDbTuning, Topology};
use crate::status_values::{
    AppPhase, DrainRequest, PodPhase, ResetPhase, StateHealth, StoreOpen, TaskState,
};

/// A stateful, exactly-once Kafka dedup processor: one pod per replica, each with its own
/// persistent RocksDB state.
// The printer columns repeat `type_ = "string"` and `priority = 1`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "streamapp.dev",
    version = "v1alpha1",
    kind = "StreamApp",
    plural = "streamapps",
    shortname = "sapp",
    category = "streaming",
    namespaced,
    status = "StreamAppStatus",
    derive = "PartialEq",
    doc = "A StreamApp runs an exactly-once Kafka deduplication processor with persistent, crash-safe RocksDB state.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.ready",
        description = "Ready pods / desired pods"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.stateHealth",
        description = "Health of the pods' state stores"
    ),
    printcolumn(
        name = "Lag",
        type_ = "integer",
        json_path = ".status.lag",
        description = "Input records not processed yet (the consumer group's lag)"
    ),
    printcolumn(
        name = "Checkpoint",
        type_ = "date",
        json_path = ".status.oldestCheckpoint",
        description = "Age of the oldest durable store commit across pods"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".spec.image",
        priority = 1
    ),
    printcolumn(
        name = "Input",
        type_ = "string",
        json_path = ".spec.topology.inputTopic",
        priority = 1
    ),
    printcolumn(
        name = "Behind",
        type_ = "string",
        json_path = ".status.lagSeconds",
        description = "About how many seconds the lag takes to process at the recent rate",
        priority = 1
    ),
    printcolumn(
        name = "Repartition-Lag",
        type_ = "integer",
        json_path = ".status.repartitionLag",
        description = "Records in the repartition topic the dedup stage has not processed yet",
        priority = 1
    ),
    printcolumn(
        name = "Restore-Lag",
        type_ = "integer",
        json_path = ".status.worstRestoreLag",
        description = "Largest changelog lag any store would replay after a crash",
        priority = 1
    ),
    printcolumn(
        name = "Standbys",
        type_ = "string",
        json_path = ".status.standbyCoverage",
        description = "Input partitions with a caught-up standby copy / all input partitions",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    )
)]
#[x_kube(
    validation = Rule::new("self.topology.outputTopic != self.topology.inputTopic && self.topology.deadLetterTopic != self.topology.inputTopic && self.topology.deadLetterTopic != self.topology.outputTopic").message("topology.inputTopic, topology.outputTopic and topology.deadLetterTopic must be three different topics"),
    validation = Rule::new("!has(self.topology.duplicatesTopic) || !(self.topology.duplicatesTopic in [self.topology.inputTopic, self.topology.outputTopic, self.topology.deadLetterTopic])").message("topology.duplicatesTopic must differ from the input, output and dead-letter topics"),
    validation = Rule::new("duration(self.topology.retention) > duration(self.topology.commitInterval)").message("topology.retention must be greater than topology.commitInterval"),
    validation = Rule::new("duration(self.topology.commitInterval) > duration('0s')").message("topology.commitInterval must be greater than 0"),
    validation = Rule::new("!has(self.topology.dedupId) || self.topology.dedupId.source != 'Header' || (has(self.topology.dedupId.header) && self.topology.dedupId.header != '')").message("topology.dedupId.header is required when topology.dedupId.source is Header"),
    validation = Rule::new("!has(self.topology.dedupId) || self.topology.dedupId.source != 'JsonPointer' || (has(self.topology.dedupId.jsonPointer) && self.topology.dedupId.jsonPointer.startsWith('/'))").message("topology.dedupId.jsonPointer (starting with '/', e.g. /commandId) is required when topology.dedupId.source is JsonPointer"),
    validation = Rule::new("!has(self.rocksdb) || !has(self.rocksdb.wal) || !has(self.rocksdb.wal.recoveryMode) || self.rocksdb.wal.recoveryMode != 'SkipAnyCorruptedRecords'").message("rocksdb.wal.recoveryMode SkipAnyCorruptedRecords can leave holes in the store that no offset reveals; use PointInTime, TolerateCorruptedTailRecords or AbsoluteConsistency"),
    validation = Rule::new("!has(self.rocksdb) || !has(self.rocksdb.compactionStyle) || self.rocksdb.compactionStyle != 'Fifo'").message("rocksdb.compactionStyle Fifo deletes the oldest SST files and with them ids the store still vouches for, so repeats would be output as first occurrences; use Level (default) or Universal"),
    validation = Rule::new("![self.topology.inputTopic, self.topology.outputTopic, self.topology.deadLetterTopic].exists(t, t.endsWith('-dedup-changelog') || t.endsWith('-dedup-repartition')) && (!has(self.topology.duplicatesTopic) || !(self.topology.duplicatesTopic.endsWith('-dedup-changelog') || self.topology.duplicatesTopic.endsWith('-dedup-repartition')))").message("topic names ending in -dedup-changelog or -dedup-repartition are StreamApp's internal topics (<namespace>.<name>-dedup-changelog and -dedup-repartition), which only the processor writes: outputs written there would become a store's state; choose another topic"),
    validation = Rule::new("![self.topology.inputTopic, self.topology.outputTopic, self.topology.deadLetterTopic].exists(t, t == '.' || t == '..') && (!has(self.topology.duplicatesTopic) || !(self.topology.duplicatesTopic in ['.', '..']))").message("topic names must not be '.' or '..' (Kafka refuses them)"),
    validation = Rule::new("!has(self.rocksdb) || !has(self.rocksdb.blockSize) || quantity(self.rocksdb.blockSize).compareTo(quantity('1Ki')) >= 0").message("rocksdb.blockSize must be at least 1Ki"),
    validation = Rule::new("!has(self.rocksdb) || !has(self.rocksdb.writeBufferSize) || quantity(self.rocksdb.writeBufferSize).compareTo(quantity('1Mi')) >= 0").message("rocksdb.writeBufferSize must be at least 1Mi (smaller memtables flush all the time)"),
    validation = Rule::new("!has(self.rocksdb) || !has(self.rocksdb.writeBufferSize) || !has(self.rocksdb.memtableBudget) || quantity(self.rocksdb.memtableBudget).compareTo(quantity(self.rocksdb.writeBufferSize)) >= 0").message("rocksdb.memtableBudget must be at least rocksdb.writeBufferSize"),
    validation = Rule::new("duration(self.topology.maxSkew) < duration(self.topology.retention)").message("topology.maxSkew must be less than topology.retention (ids are remembered for retention minus maxSkew at least)"),
    validation = Rule::new("!has(self.standbyReplicas) || self.standbyReplicas == 0 || !has(self.kafka.properties) || ((!('sasl.mechanism' in self.kafka.properties) || self.kafka.properties['sasl.mechanism'].upperAscii() in ['PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512']) && (!('sasl.mechanisms' in self.kafka.properties) || self.kafka.properties['sasl.mechanisms'].upperAscii() in ['PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512']) && (!('security.protocol' in self.kafka.properties) || !self.kafka.properties['security.protocol'].lowerAscii().startsWith('sasl') || 'sasl.mechanism' in self.kafka.properties || 'sasl.mechanisms' in self.kafka.properties))").message("standbyReplicas with SASL needs kafka.properties sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512: the state-aware group membership does not speak GSSAPI (librdkafka's default) or OAUTHBEARER"),
    validation = Rule::new("quantity(self.topology.maxValueSize).asInteger() + 65536 <= (has(self.kafka.properties) && 'message.max.bytes' in self.kafka.properties ? int(self.kafka.properties['message.max.bytes']) : 1000000)").message("topology.maxValueSize plus 64Ki for key and headers must fit the producer's message.max.bytes (kafka.properties.message.max.bytes, librdkafka's default 1000000): use at most 934464 bytes (the default is 900k) or raise message.max.bytes"),
)]
#[serde(rename_all = "camelCase")]
pub struct StreamAppSpec {
    /// Container image with the streamapp-processor and streamapp-agent binaries.
    #[schemars(length(min = 1))]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Number of processor pods. Partitions of the input topic are spread across them.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Warm copies of each partition's state store kept on other pods (capped at replicas − 1):
    /// a pod that is lost hands its partitions to the holders of their copies, which replay
    /// only the changelog tail they have not applied yet instead of the whole changelog. A
    /// copy holds only committed records. With 1 or more the processors share the partitions
    /// through StreamApp's state-aware assignor (a partition stays where its store is caught
    /// up; a move to a pod that would restore more than 10,000 changelog records
    /// warms a copy up there first).
    #[serde(default, skip_serializing_if = "no_standbys")]
    #[schemars(range(min = 0, max = 10))]
    pub standby_replicas: i32,
    /// Processing threads per pod (Kafka Streams' `num.stream.threads`): each is a consumer
    /// group member with its own transactional producer and its own share of the partitions,
    /// so a pod with several partitions uses that many cores (give the container the CPU).
    /// Memory does not grow with it: the pod's stores share one block cache and memtable
    /// budget. With `standbyReplicas`, a task's standbys are kept on other pods than its
    /// active thread's.
    #[serde(
        default = "default_processing_threads",
        skip_serializing_if = "one_thread"
    )]
    #[schemars(range(min = 1, max = 16))]
    pub processing_threads: i32,
    /// How the processors reach Kafka.
    pub kafka: KafkaSpec,
    /// What is deduplicated and where records go.
    pub topology: Topology,
    /// Persistent volumes for the state stores (and optionally their write-ahead logs).
    #[serde(default)]
    pub storage: StorageSpec,
    /// RocksDB tuning: a profile plus any knob to override.
    #[serde(default)]
    pub rocksdb: RocksDbTuning,
    /// Graceful shutdown: the drain that runs before a pod stops.
    #[serde(default)]
    pub shutdown: ShutdownSpec,
    /// Resources of the processor container. The memory limit must hold RocksDB's block cache
    /// and write buffers (they live outside any heap); the operator checks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Pod placement and metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
    /// The state-health agent sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
    /// Voluntary disruptions (node drains, cluster upgrades) take at most this many pods at
    /// once, so at most that many restore their stores while the others keep processing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<DisruptionBudgetSpec>,
    /// The pods' NetworkPolicy (on by default): ingress only to the processor's HTTP port
    /// (metrics, probes, the drain endpoint) and the agent's metrics port; egress (Kafka, the
    /// API server) is not restricted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
    /// What deleting the StreamApp leaves in Kafka. `Retain` (default): the consumer group and
    /// the internal topics (changelog, repartition) stay, so a StreamApp created again under
    /// the same name resumes where this one stopped. `Delete`: the pods are stopped and the
    /// group and internal topics deleted before the StreamApp goes (a finalizer; given up after
    /// 5 minutes, with a Warning event, so deletion never blocks for ever). Transactional ids
    /// cannot be deleted; the broker expires them (transactional.id.expiration.ms).
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// What the operator does about pods on a node that is gone: not Ready for `after`,
    /// tainted `node.kubernetes.io/out-of-service`, or deleted. Kubernetes alone leaves a
    /// StatefulSet's pod there until someone force-deletes it; Kafka fences the old pod (its
    /// transactional id and its group generation), so replacing it cannot duplicate or lose a
    /// record even if its process still runs.
    #[serde(default)]
    pub node_loss: NodeLossSpec,
}

/// `spec.nodeLoss`.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLossSpec {
    /// `Replace` (default): force-delete the pod, so that the StatefulSet creates it again on
    /// another node; never while it is still a live member of its consumer group (its node lost
    /// only the API server, and its output flows), nor while most nodes are not Ready (the
    /// control plane is the likely fault), nor more pods at once than the disruption budget
    /// allows. `Wait`: nothing (an administrator force-deletes, as with any StatefulSet).
    #[serde(default)]
    pub action: NodeLossAction,
    /// How long a node is not Ready before its pods count as lost (at least 10s).
    #[serde(default = "default_node_loss_after")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s')").message("nodeLoss.after must be at least 10s: a node's Ready condition can flip for shorter blips"))]
    pub after: String,
    /// A state volume only the lost node can reach (a local PersistentVolume). `Recreate`
    /// (default): its claim is deleted with the pod; the replacement gets a new volume and
    /// restores from a standby or the changelog. `Keep`: the replacement waits for the node.
    #[serde(default)]
    pub local_volumes: LocalVolumesOnNodeLoss,
}

pub fn default_node_loss_after() -> String {
    "60s".into()
}

impl Default for NodeLossSpec {
    fn default() -> Self {
        NodeLossSpec {
            action: NodeLossAction::default(),
            after: default_node_loss_after(),
            local_volumes: LocalVolumesOnNodeLoss::default(),
        }
    }
}

/// `spec.nodeLoss.action`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NodeLossAction {
    #[default]
    Replace,
    Wait,
}

/// `spec.nodeLoss.localVolumes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LocalVolumesOnNodeLoss {
    #[default]
    Recreate,
    Keep,
}

#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudgetSpec {
    /// Pods a voluntary disruption may take down at once: a number or a percentage, at least
    /// one pod (0 or 0% would block every node drain for ever).
    #[serde(default = "default_max_unavailable")]
    #[x_kube(validation = Rule::new("type(self) == int ? self > 0 : (self.matches('^[0-9]+%$') && !self.matches('^0+%$'))").message("disruptionBudget.maxUnavailable must allow at least one pod: a number from 1 or a percentage from 1% (0 would block every node drain, kubectl drain and node upgrades, for ever)"))]
    pub max_unavailable: k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
}

pub fn default_max_unavailable() -> k8s_openapi::apimachinery::pkg::util::intstr::IntOrString {
    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Create the NetworkPolicy (default true). Off: the operator deletes one it created.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Who may reach those ports (NetworkPolicy peers, e.g. the namespace of your Prometheus);
    /// unset or empty: any pod in any namespace. The kubelet's probes come from the node, and
    /// the drain endpoint answers only loopback callers (the preStop hook) anyway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Delete,
}

fn no_standbys(n: &i32) -> bool {
    *n == 0
}

fn one_thread(n: &i32) -> bool {
    *n == 1
}

pub fn default_processing_threads() -> i32 {
    1
}

pub fn default_replicas() -> i32 {
    1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// Kafka connection.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
// The list is RESERVED_KAFKA_PROPERTIES (a unit test keeps the two in step).
#[x_kube(validation = Rule::new("!has(self.properties) || self.properties.all(k, !(k in ['isolation.level', 'transactional.id', 'enable.idempotence', 'acks', 'enable.auto.commit', 'enable.auto.offset.store', 'auto.offset.reset', 'group.id', 'group.instance.id', 'bootstrap.servers', 'group.protocol', 'group.remote.assignor', 'partition.assignment.strategy', 'enable.partition.eof']))").message("kafka.properties must not set isolation.level, transactional.id, enable.idempotence, acks, enable.auto.commit, enable.auto.offset.store, auto.offset.reset, group.id, group.instance.id, bootstrap.servers, group.protocol, group.remote.assignor, partition.assignment.strategy or enable.partition.eof: the processor sets them for exactly-once processing and its eager rebalance handling (the KIP-848 consumer protocol and cooperative assignors are not supported)"))]
#[serde(rename_all = "camelCase")]
pub struct KafkaSpec {
    /// Comma-separated `host:port` list.
    #[schemars(length(min = 1))]
    pub bootstrap_servers: String,
    /// librdkafka client properties passed through as they are, e.g. `security.protocol:
    /// SASL_SSL`, `sasl.mechanism: SCRAM-SHA-512`. Put secrets in `sasl` and `tls`, not here.
    /// At most 128 (the bound keeps the CEL rules' cost within the API server's budget).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 128))]
    pub properties: BTreeMap<String, String>,
    /// SASL credentials from a Secret (become `sasl.username` / `sasl.password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSecret>,
    /// TLS material from a Secret, mounted into the processor (becomes `ssl.ca.location` and,
    /// when present, `ssl.certificate.location` / `ssl.key.location`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSecret>,
    /// What the operator does about a *hanging* transaction: one open on a partition of the
    /// app's topics that no transaction coordinator will ever end (every read_committed reader
    /// stops at it). It is always reported (condition `TransactionsHealthy`, a Warning event
    /// with the command an administrator would run). `IfOwnerGone` (the default) also ends it,
    /// with an abort marker, when its producer is none of this app's running pods and the
    /// partition is one of the app's internal topics (repartition, changelog), which only its
    /// processors write; `IfOwnerGoneOnAllTopics` on its input, output, duplicates and
    /// dead-letter topics too (only where no other application writes transactions);
    /// `Never` only reports.
    #[serde(default)]
    pub abort_hanging_transactions: AbortHangingTransactions,
}

/// `spec.kafka.abortHangingTransactions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AbortHangingTransactions {
    Never,
    #[default]
    IfOwnerGone,
    IfOwnerGoneOnAllTopics,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SaslSecret {
    /// Name of a Secret in the StreamApp's namespace.
    #[schemars(length(min = 1))]
    pub secret_name: String,
    #[serde(default = "default_username_key")]
    pub username_key: String,
    #[serde(default = "default_password_key")]
    pub password_key: String,
}

pub fn default_username_key() -> String {
    "username".into()
}
pub fn default_password_key() -> String {
    "password".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSecret {
    /// Name of a Secret in the StreamApp's namespace with `ca.crt` and optionally `tls.crt` and
    /// `tls.key` (client authentication).
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// Volumes for state.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
// Struct-level rules: a field-level transition rule is not evaluated when the field is added
// or removed, and setting a class that was unset changes the claim templates just the same.
#[x_kube(
    validation = Rule::new("has(self.walVolume) == has(oldSelf.walVolume)").message("storage.walVolume cannot be added or removed once the StreamApp exists: the StatefulSet's volume claim templates cannot change"),
    validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storage.storageClassName cannot change: existing volumes keep their class"),
)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Size of each pod's state volume. It may grow (existing claims are expanded where the
    /// storage class allows it) but not shrink.
    #[serde(default = "default_storage_size")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity(oldSelf)) >= 0").message("storage.size may grow but not shrink: volumes cannot be made smaller"))]
    pub size: String,
    /// Storage class of the state volumes (the cluster default when unset). Cannot change
    /// once the volumes exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// A separate volume for RocksDB's write-ahead logs, for example on faster disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_volume: Option<WalVolumeSpec>,
    /// What happens to the volumes when the StreamApp is deleted or scaled down. `Retain`
    /// (default) keeps the state so a re-created or re-scaled app restores only a tail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<VolumeRetentionPolicy>,
}

pub fn default_storage_size() -> String {
    "1Gi".into()
}

impl Default for StorageSpec {
    fn default() -> Self {
        StorageSpec {
            size: default_storage_size(),
            storage_class_name: None,
            wal_volume: None,
            retention_policy: None,
        }
    }
}

#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storage.walVolume.storageClassName cannot change: existing volumes keep their class"))]
#[serde(rename_all = "camelCase")]
pub struct WalVolumeSpec {
    /// Size of each pod's WAL volume; may grow, not shrink.
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity(oldSelf)) >= 0").message("storage.walVolume.size may grow but not shrink: volumes cannot be made smaller"))]
    pub size: String,
    /// Storage class of the WAL volumes (the cluster default when unset). Cannot change once
    /// the volumes exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRetentionPolicy {
    #[serde(default)]
    pub when_deleted: RetainOrDelete,
    #[serde(default)]
    pub when_scaled: RetainOrDelete,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RetainOrDelete {
    #[default]
    Retain,
    Delete,
}

/// Graceful shutdown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownSpec {
    /// Time the drain may take: finish the transaction, apply it, flush memtables, sync the WAL
    /// and write checkpoints. Sets the preStop hook's wait and the pod's
    /// terminationGracePeriodSeconds (this plus a margin).
    #[serde(default = "default_drain_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub drain_timeout: String,
}

pub fn default_drain_timeout() -> String {
    "60s".into()
}

impl Default for ShutdownSpec {
    fn default() -> Self {
        ShutdownSpec {
            drain_timeout: default_drain_timeout(),
        }
    }
}

/// Pod placement and metadata, passed to the StatefulSet's pod template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How the pods spread over the cluster. Unset: across zones and nodes as evenly as the
    /// scheduler can (`ScheduleAnyway`, so a small cluster still runs every pod); `[]`: no
    /// constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// Service account of the pods. By default the operator creates `<name>-agent`, allowed
    /// only to report this StreamApp's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Extra environment variables of the processor container, for example `RUST_LOG`. The
    /// variables the operator sets itself (`POD_NAME`, `STREAMAPP_*`, `KAFKA_SASL_*`) keep the
    /// operator's values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// The agent sidecar.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Image of the agent (defaults to `spec.image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Longest time between two status reports when nothing changes (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub heartbeat: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Observed state. The operator owns every field but `pods`; each agent owns its own pod's
/// entry in `pods` (server-side apply, list keyed by pod name).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamAppStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, Progressing, Running, Degraded or Stopped (scaled to zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AppPhase>,
    /// Pods of the StatefulSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pods whose processor has restored its state and is processing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// `ready/desired`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Label selector of the pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Healthy, Degraded or Unknown: the worst of the pods' state reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_health: Option<StateHealth>,
    /// Largest number of changelog records any store would replay after a crash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_restore_lag: Option<i64>,
    /// With `standbyReplicas`: input partitions that have a caught-up standby copy on some pod
    /// (at most 10,000 changelog records behind), of all input partitions, e.g. `4/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_coverage: Option<String>,
    /// When the store that committed least recently did so (across pods): `kubectl get` shows
    /// its age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_checkpoint: Option<Time>,
    /// The consumer group the pods commit their input offsets in (the application id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_group: Option<String>,
    /// Input records not processed yet: the input's end offsets minus the group's committed
    /// offsets, as the operator last read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// About how long the lag takes to process at the rate of the last minutes, in seconds;
    /// unset while the group makes no progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// When the topology repartitions (`topology.repartition`): records the route stage wrote
    /// to the repartition topic that the dedup stage has not committed yet (the second stage's
    /// lag; `lag` is the first's). Counted in offsets, so the markers of the route stage's
    /// transactions that follow the last record count too: when nothing waits, up to one per
    /// partition for each pod whose route stage wrote to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repartition_lag: Option<i64>,
    /// Partitions of the input topic, as the operator last read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_partitions: Option<i32>,
    /// The application reset asked for with the `streamapp.dev/reset` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<ResetStatus>,
    /// Hash of the processor configuration the pods run with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// Ready, Progressing, StateHealthy, Degraded and ReconciliationPaused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// One entry per pod, written by that pod's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pods: Vec<PodStateStatus>,
}

/// An application reset, from request to done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetStatus {
    /// The annotation's value this reset is for (`earliest`, `latest` or an RFC 3339 time).
    pub request: String,
    /// StoppingPods, ResettingOffsets, ClearingState, StartingPods, Done or Failed.
    pub phase: ResetPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// A pod's state health, as its agent last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodStateStatus {
    /// Pod name.
    pub name: String,
    /// The UID of the pod whose agent wrote this entry. A pod of the same name made since (one
    /// replaced while its node was away) has another UID: the entry is then stale, and the
    /// operator neither counts it nor keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// When the agent wrote this entry (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<String>,
    /// Starting, Restoring, Running, Draining, Drained, Failed or Down (no processor running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PodPhase>,
    /// The processor answers /healthz.
    #[serde(default)]
    pub processor_up: bool,
    /// The processor answers /readyz (state restored).
    #[serde(default)]
    pub ready: bool,
    /// Whether the processor's previous shutdown was a completed drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_shutdown_clean: Option<bool>,
    /// How long the last drain took, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<i64>,
    /// Who asked for the last drain: `Http` (the preStop hook's `streamapp-processor drain`)
    /// or `Signal` (SIGTERM without a preStop drain first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_requested_by: Option<DrainRequest>,
    /// Free bytes on the state volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_disk_bytes: Option<i64>,
    /// Quarantined stores on this pod's volume.
    #[serde(default)]
    pub quarantines: i32,
    /// Records the processor sent to the dead-letter topic since it started (committed).
    #[serde(default)]
    pub dead_letters: i64,
    /// With `topology.repartition: Never`: records since the processor started whose key is
    /// not their dedup id (repeats of such ids on other partitions are output again).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub miskeyed_records: i64,
    /// Changelog records a restore or a standby on this pod skipped since the processor
    /// started: not written by the processor (no key, or a value that is not a time), so
    /// someone else writes to the changelog. A key without a value (a tombstone) is not
    /// skipped: it makes a rebuilt store forget that id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_changelog_records: i64,
    /// The last changelog record skipped: `partition/offset: why`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_changelog_record: Option<String>,
    /// The latest dead letter: when, its reason, where the original is and what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_dead_letter: Option<String>,
    /// Partitions of the input topic. With more replicas than partitions some pods own none:
    /// they stay Ready and idle, and take partitions over when another pod goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_partitions: Option<i32>,
    /// Why the state is not healthy, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Per task (input partition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskStateStatus>,
}

/// A task's store, as the agent last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStateStatus {
    pub partition: i32,
    /// Opening, Restoring, Restored, Active, BackingOff, Standby or WarmingUp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Why the store cannot be used for now (a full disk, an I/O error, its lock held), while
    /// the processor backs off and retries. Such stores are never quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// Since when the store backs off (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_since: Option<String>,
    /// Next input offset, as committed in the last transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_offset: Option<i64>,
    /// End of the changelog partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changelog_end: Option<i64>,
    /// Changelog records a restart would replay (changelog end minus the store's offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_lag: Option<i64>,
    /// While restoring: records restored so far of records to restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreStatus>,
    /// While the task's input (the repartition topic, or the input topic without one) stands
    /// at its last stable offset behind a transaction that stays open: the offset that
    /// transaction starts at. A transaction that never ends is found by the operator
    /// (condition TransactionsHealthy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_waiting_for_transaction_at: Option<i64>,
    /// How the store was opened: Clean, ReplayedTail, FullRestore, Rebuilt or Resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened: Option<StoreOpen>,
    /// Seconds since the store last durably recorded a commit (or a drain checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_age_seconds: Option<i64>,
    #[serde(default)]
    pub wal_files: i64,
    #[serde(default)]
    pub wal_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_oldest_age_seconds: Option<i64>,
    #[serde(default)]
    pub quarantines: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_quarantine_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_quarantine_at: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    pub restored: i64,
    pub total: i64,
    /// Records per second so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<i64>,
    /// Estimated seconds left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// While the restore waits for a transaction open on the changelog to end: the offset it
    /// starts at (read_committed readers stop there). A transaction that never ends is found
    /// by the operator (condition TransactionsHealthy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for_transaction_at: Option<i64>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_has_the_names_users_type() {
        let crd = StreamApp::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("streamapps.streamapp.dev")
        );
        assert_eq!(crd.spec.names.short_names, Some(vec!["sapp".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        let sub = version.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        assert_eq!(
            sub.scale.as_ref().unwrap().label_selector_path.as_deref(),
            Some(".status.selector")
        );
    }

    #[test]
    fn status_pods_is_a_list_map_keyed_by_pod_name() {
        let crd = serde_json::to_value(StreamApp::crd()).unwrap();
        let pods = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["pods"];
        assert_eq!(pods["x-kubernetes-list-type"], "map");
        assert_eq!(
            pods["x-kubernetes-list-map-keys"],
            serde_json::json!(["name"])
        );
    }

    #[test]
    fn conditions_are_a_list_map_keyed_by_type() {
        let crd = serde_json::to_value(StreamApp::crd()).unwrap();
        let conditions = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
    }

    #[test]
    fn the_crd_refuses_exactly_the_reserved_kafka_properties() {
        let crd = serde_json::to_string(&StreamApp::crd()).unwrap();
        let start = crd
            .find("self.properties.all(k, !(k in [")
            .expect("the rule");
        let list = &crd[start..start + crd[start..].find(']').unwrap()];
        let in_rule: Vec<&str> = list
            .split('[')
            .nth(1)
            .unwrap()
            .split(", ")
            .map(|k| k.trim_matches('\''))
            .collect();
        assert_eq!(in_rule, crate::config::RESERVED_KAFKA_PROPERTIES);
    }

    #[test]
    fn cel_rules_are_in_the_schema() {
        let crd = serde_json::to_string(&StreamApp::crd()).unwrap();
        assert!(crd.contains(
            "duration(self.topology.retention) > duration(self.topology.commitInterval)"
        ));
        assert!(crd.contains("storage.size may grow but not shrink"));
        assert!(crd.contains("self.rocksdb.compactionStyle != 'Fifo'"));
        assert!(
            crd.contains("duration(self.topology.maxSkew) < duration(self.topology.retention)")
        );
        assert!(crd.contains(&format!(
            "quantity(self.topology.maxValueSize).asInteger() + {} <=",
            crate::config::RECORD_OVERHEAD_BYTES
        )));
        assert!(crd.contains(&format!(
            ": {})",
            crate::config::DEFAULT_PRODUCER_MESSAGE_MAX_BYTES
        )));
    }
}
