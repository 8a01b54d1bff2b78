//! The processor's health file: `<state-dir>/health.json` (see [`crate::state_volume`]),
//! replaced atomically ([`write_atomically`](crate::state_volume::write_atomically)) whenever
//! something worth reporting changes.
//!
//! The processor writes it; the agent reads it (also after the processor died, which is why
//! it lives on the state volume and not only behind HTTP). Times are Unix milliseconds.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Schema version written in [`ProcessorHealth::version`].
pub const HEALTH_VERSION: u32 = 1;

/// What the processor is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProcessorPhase {
    /// Opening stores, joining the group.
    #[default]
    Starting,
    /// Replaying changelog tails into stores; not ready.
    Restoring,
    /// Processing input.
    Running,
    /// Finishing the transaction, flushing stores and writing checkpoints.
    Draining,
    /// Drained: stores flushed, checkpoints written. The next start restores nothing.
    Drained,
    /// Stopped on an error it could not handle (the message says which).
    Failed,
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorHealth {
    pub version: u32,
    /// Pod (instance) name; also the transactional and static-membership identity.
    pub pod: String,
    pub application_id: String,
    pub phase: ProcessorPhase,
    /// Process id, so a reader can tell a stale file from a live processor.
    pub pid: u32,
    pub started_at_ms: i64,
    pub updated_at_ms: i64,
    /// Whether the shutdown before this start was a completed drain (checkpoints present for
    /// every store it found). `None` on a first start with an empty state dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_shutdown_clean: Option<bool>,
    /// Set when a drain finished: how long it took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<u64>,
    /// Set when a drain was asked for: by whom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_requested_by: Option<DrainRequest>,
    /// Why the processor failed, when phase is Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why `/readyz` does not answer 200, when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_reason: Option<String>,
    /// Partitions of the input topic, as found at start-up. A processor that owns none of
    /// them (more replicas than partitions) is idle by design and still ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_partitions: Option<u32>,
    /// Dead letters committed since the processor started, by reason (the
    /// `streamapp.dlq.reason` header).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dead_letters: BTreeMap<String, u64>,
    /// The latest committed dead letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_dead_letter: Option<DeadLetterNote>,
    /// With `topology.repartition: Never`: records committed since the processor started
    /// whose key is not their dedup id (the input is not keyed by the id as assumed, and a
    /// repeat of such an id on another partition is output again).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub miskeyed_records: u64,
    /// Changelog records a restore or a standby skipped since the processor started because
    /// they are not records the processor writes (no key, a value that is not a time): someone
    /// else wrote to the changelog. A key without a value (a tombstone) is not skipped: it
    /// makes the store forget the id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_changelog_records: u64,
    /// The last one skipped: `partition/offset: why`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_changelog_record: Option<String>,
    /// One entry per task (input partition) this process owns.
    #[serde(default)]
    pub tasks: Vec<TaskHealth>,
}

/// A record that went to the dead-letter topic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterNote {
    pub at_ms: i64,
    /// The `streamapp.dlq.reason` header.
    pub reason: String,
    /// `topic/partition/offset` of the original record.
    pub source: String,
    /// What went wrong, in words.
    pub detail: String,
}

/// Who asked the processor to drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DrainRequest {
    /// `POST /drain`: what the pod's preStop hook (`streamapp-processor drain`) sends.
    Http,
    /// SIGTERM or SIGINT: the kubelet stopping the container (after the preStop hook, or
    /// without one).
    Signal,
}

/// How a task's store was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StoreOpen {
    /// A checkpoint matched the store's own offsets: nothing to replay.
    Clean,
    /// Opened after an unclean stop: the changelog tail after the store's offset was replayed.
    ReplayedTail,
    /// No local store (new task): restored from the start of the changelog.
    FullRestore,
    /// The store was damaged: quarantined and rebuilt from the changelog.
    Rebuilt,
    /// The partition came back to this process while its store was still open (suspended
    /// after a revoke): the changelog tail was replayed into it.
    Resumed,
}

/// Where a task is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TaskState {
    /// Assigned; the store is being opened.
    Opening,
    /// Replaying the changelog tail into the store.
    Restoring,
    /// Restored; joins the consumer's assignment once the open transaction commits.
    Restored,
    /// Processing records.
    Active,
    /// The store cannot be used for now (disk full, an I/O error, its lock held): closed and
    /// retried later. Nothing is deleted or quarantined.
    BackingOff,
    /// A standby replica: the store follows the changelog (committed records only), ready to
    /// take the task over with at most a short tail to replay.
    Standby,
    /// A standby that is a move in progress: the task becomes active here once the store is
    /// caught up (the next probing rebalance).
    WarmingUp,
}

/// Why a store cannot be used for now, although it is not damaged.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum StoreUnavailable {
    /// No space left on the state (or WAL) volume.
    DiskFull,
    /// Another process holds the store's LOCK file.
    Locked,
    /// An I/O error other than a full disk (EIO, a read-only remount, ...).
    Io,
    /// RocksDB refused the store's options or format (InvalidArgument, NotSupported).
    Incompatible,
    /// The store was found damaged and rebuilt several times in a row without ever becoming
    /// healthy: the volume itself is suspect, so the processor stops quarantining it.
    RepeatedDamage,
}

/// A task backing off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreBackoff {
    pub kind: StoreUnavailable,
    /// RocksDB's (or the file system's) message.
    pub reason: String,
    /// When this episode started (the first failure).
    pub since_ms: i64,
    /// Failed attempts so far in this episode.
    pub attempts: u32,
    /// When the store is tried again.
    pub retry_at_ms: i64,
}

/// One task: an input partition, its store and its changelog partition.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskHealth {
    pub partition: i32,
    /// Where the task is in its lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Set while the task backs off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<StoreBackoff>,
    /// Next input offset to process, as committed in the last Kafka transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_offset: Option<i64>,
    /// Next changelog offset the store has not applied (stored atomically with the data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_changelog_offset: Option<i64>,
    /// End of the changelog partition (read_committed), when last looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changelog_end_offset: Option<i64>,
    /// How the store was opened this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened: Option<StoreOpen>,
    /// Restore progress, while restoring and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreProgress>,
    /// While the active task's input (the repartition topic, or the input topic without one)
    /// stands at its last stable offset behind a transaction that stays open: the offset that
    /// transaction starts at, where read_committed readers stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_waiting_for_transaction_at: Option<i64>,
    /// When the checkpoint file of this task was last written (a drain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_at_ms: Option<i64>,
    /// Keys in the store (RocksDB's estimate).
    #[serde(default)]
    pub store_keys: u64,
    /// Bytes of SST files of the store.
    #[serde(default)]
    pub store_bytes: u64,
    #[serde(default)]
    pub wal: WalFiles,
    /// Quarantines of this task's store, newest last (bounded).
    #[serde(default)]
    pub quarantines: Vec<Quarantine>,
    /// The background checksum scan of the open store: the one running, or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<StoreVerification>,
}

/// A background checksum scan of a store (every key read with checksums verified).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreVerification {
    pub reason: VerificationReason,
    pub started_at_ms: i64,
    /// Set once every key was read and found intact. Damage quarantines the store instead
    /// (see `quarantines`), and its rebuilt successor starts without a verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<i64>,
    /// Keys read (when finished).
    #[serde(default)]
    pub keys: u64,
}

/// Why a store is scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VerificationReason {
    /// It was opened after an unclean stop (kill -9, a node crash): it is used at once and
    /// scanned meanwhile.
    UncleanShutdown,
    /// The periodic scan (`rocksdb.verification.intervalSeconds`).
    Periodic,
}

/// Changelog replay into a store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreProgress {
    pub records_restored: u64,
    /// Records between the store's offset and the changelog end when restore began.
    pub records_to_restore: u64,
    pub started_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<i64>,
    /// While the restore waits for a transaction open on the changelog to end: the offset it
    /// starts at (the store's changelog offset; read_committed readers stop there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for_transaction_at: Option<i64>,
}

/// RocksDB write-ahead log files of a store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalFiles {
    pub files: u64,
    pub bytes: u64,
    /// Age of the oldest live WAL file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_age_seconds: Option<u64>,
}

/// A damaged store moved aside for forensics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    pub at_ms: i64,
    pub reason: String,
    /// Where the damaged store was moved to.
    pub path: String,
}

impl ProcessorHealth {
    pub fn new(pod: &str, application_id: &str, now_ms: i64) -> Self {
        ProcessorHealth {
            version: HEALTH_VERSION,
            pod: pod.into(),
            application_id: application_id.into(),
            phase: ProcessorPhase::Starting,
            pid: std::process::id(),
            started_at_ms: now_ms,
            updated_at_ms: now_ms,
            ..Default::default()
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
