//! The processor's configuration: the pipeline (topics, dedup id, windows), the Kafka client and
//! the RocksDB tuning.
//!
//! The same types appear in the `StreamApp` spec (users write them) and in the processor's
//! configuration file (the operator renders them into a ConfigMap, the processor reads it), so
//! a knob means the same thing everywhere. Defaults live beside the types.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// RocksDB tuning. Every field is optional: unset fields take the value of `profile`.
/// The block cache is shared by all stores of a processor and bounded, so memory stays
/// predictable however many partitions a pod owns.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RocksDbTuning {
    /// Starting point for every unset knob. `Balanced` matches Kafka Streams' defaults,
    /// `LowMemory` suits many small apps, `Throughput` trades memory for write speed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<RocksDbProfile>,
    /// Shared LRU block cache for all stores of the pod (quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub block_cache_size: Option<String>,
    /// Size of one memtable (quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub write_buffer_size: Option<String>,
    /// Memtables per store (the active one plus those being flushed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 16))]
    pub max_write_buffer_number: Option<i32>,
    /// Limit on the memtables of all stores of the pod together (quantity): RocksDB flushes
    /// early rather than exceed it, so memory does not grow with the number of partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub memtable_budget: Option<String>,
    /// With `standbyReplicas`: the part of `memtableBudget` kept for the stores of standby
    /// and warm-up tasks (quantity; default a quarter of it). Their memtables count against
    /// this part only, so a standby catching up can never stall an active store's writes;
    /// active stores get the rest. Without standbys the whole budget is the active stores'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub standby_memtable_budget: Option<String>,
    /// SST data block size (quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub block_size: Option<String>,
    /// Bloom filter bits per key; 0 disables the filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 32))]
    pub bloom_filter_bits_per_key: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_style: Option<CompactionStyle>,
    /// Background flush and compaction threads per store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_background_jobs: Option<i32>,
    /// Write-ahead log settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal: Option<WalTuning>,
    /// The background checksum scan of every store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationTuning>,
}

/// The background verifier reads every key of a store with checksums verified, off the
/// processing thread and at a bounded rate: after an unclean stop (the store is used at once,
/// its tail replayed; the scan runs meanwhile) and again every `intervalSeconds`. Damage it
/// finds quarantines the store and rebuilds it from the changelog.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationTuning {
    /// Seconds between two scans of the same open store (0: only after an unclean stop).
    /// Default 86400 (a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub interval_seconds: Option<i64>,
    /// Keys read per second at most, over all stores of the pod. Default 500000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000))]
    pub keys_per_second: Option<i64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RocksDbProfile {
    #[default]
    Balanced,
    LowMemory,
    Throughput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Compression {
    None,
    Snappy,
    Lz4,
    Zstd,
}

/// RocksDB's compaction styles. `Level` and `Universal` keep every live key; `Fifo` deletes
/// the oldest SST files when the store grows past a size, which would drop ids the store's
/// changelog offset still vouches for (repeats would then be output as first occurrences):
/// the processor refuses it. Expiry by the window (`topology.retention`) bounds the store's
/// size instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CompactionStyle {
    Level,
    Universal,
    /// Refused (see above).
    Fifo,
}

/// RocksDB's four WAL recovery modes: what to do with a damaged write-ahead log on open.
///
/// Because offsets live in the same atomic batch as the data, any mode that recovers a
/// consistent prefix is safe here: the changelog tail replays whatever was lost.
/// `SkipAnyCorruptedRecords` can leave holes in the middle of the log (a later batch applied
/// without an earlier one) that no offset can reveal, so the processor refuses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WalRecoveryMode {
    /// Ignore an incomplete record at the end of the log (a torn last write); fail on anything
    /// else, which makes the processor quarantine and rebuild.
    TolerateCorruptedTailRecords,
    /// Fail on any damage; the processor quarantines and rebuilds.
    AbsoluteConsistency,
    /// Recover up to the first damaged record and stop there: a consistent prefix.
    #[default]
    PointInTime,
    /// Skip damaged records and keep going: may leave holes. Refused.
    SkipAnyCorruptedRecords,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WalTuning {
    /// Whether RocksDB writes a WAL. Without it, what was not flushed is replayed from the
    /// changelog after a crash (correct either way; the WAL makes recovery shorter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_mode: Option<WalRecoveryMode>,
    /// Archived WAL files are deleted after this many seconds (0: as soon as possible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds: Option<i64>,
    /// Archived WAL files are deleted when they add up to more than this many MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub size_limit_mb: Option<i64>,
    /// Live WAL size that forces a memtable flush (quantity); bounds replay time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$"))]
    pub max_total_size: Option<String>,
    /// fsync the WAL each time a committed transaction is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_on_commit: Option<bool>,
}

/// Memory of the processor beyond RocksDB and its processing threads' Kafka clients: HTTP, the
/// runtime, the rest of the process.
pub const PROCESS_BASE_BYTES: u64 = 112 << 20;
/// Memory of each processing thread's Kafka clients: librdkafka's producer and consumer queues
/// (the engine bounds them to 64 MiB and 16 MiB).
pub const THREAD_CLIENT_BYTES: u64 = 80 << 20;

/// Memory of the processor beyond RocksDB with `processing_threads` threads (192 MiB with
/// one): the stores' memory is shared by the threads, their Kafka clients are not.
pub fn process_overhead_bytes(processing_threads: u32) -> u64 {
    PROCESS_BASE_BYTES + THREAD_CLIENT_BYTES * u64::from(processing_threads.max(1))
}

/// RocksDB tuning with every knob decided: what the processor opens its stores with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResolvedRocksDb {
    pub block_cache_bytes: u64,
    pub write_buffer_bytes: u64,
    pub max_write_buffer_number: i32,
    pub memtable_budget_bytes: u64,
    /// The part of `memtable_budget_bytes` kept for standby and warm-up stores when the
    /// processor has standbys ([`ResolvedRocksDb::memtable_budgets`]).
    pub standby_memtable_budget_bytes: u64,
    pub block_size_bytes: u64,
    pub bloom_filter_bits_per_key: i32,
    pub compression: Compression,
    pub compaction_style: CompactionStyle,
    pub max_background_jobs: i32,
    pub wal_enabled: bool,
    pub wal_recovery_mode: WalRecoveryMode,
    pub wal_ttl_seconds: u64,
    pub wal_size_limit_mb: u64,
    pub wal_max_total_bytes: u64,
    pub wal_sync_on_commit: bool,
    /// Seconds between background scans of an open store; 0: only after an unclean stop.
    pub verify_interval_seconds: u64,
    /// Keys the background verifier reads per second at most.
    pub verify_keys_per_second: u64,
}

impl ResolvedRocksDb {
    /// The profile's values for every knob.
    pub fn profile(profile: RocksDbProfile) -> Self {
        const MI: u64 = 1 << 20;
        let balanced = ResolvedRocksDb {
            // Kafka Streams: 50 MiB cache, 16 MiB x 3 write buffers, 4 KiB blocks, bloom filter,
            // no compression; we keep level compaction (bounded space amplification).
            block_cache_bytes: 50 * MI,
            write_buffer_bytes: 16 * MI,
            max_write_buffer_number: 3,
            memtable_budget_bytes: 128 * MI,
            standby_memtable_budget_bytes: 128 * MI / 4,
            block_size_bytes: 4 * 1024,
            bloom_filter_bits_per_key: 10,
            compression: Compression::None,
            compaction_style: CompactionStyle::Level,
            max_background_jobs: 2,
            wal_enabled: true,
            wal_recovery_mode: WalRecoveryMode::PointInTime,
            wal_ttl_seconds: 0,
            wal_size_limit_mb: 0,
            wal_max_total_bytes: 64 * MI,
            wal_sync_on_commit: true,
            verify_interval_seconds: 24 * 3600,
            verify_keys_per_second: 500_000,
        };
        match profile {
            RocksDbProfile::Balanced => balanced,
            RocksDbProfile::LowMemory => ResolvedRocksDb {
                block_cache_bytes: 16 * MI,
                write_buffer_bytes: 4 * MI,
                max_write_buffer_number: 2,
                memtable_budget_bytes: 32 * MI,
                standby_memtable_budget_bytes: 32 * MI / 4,
                compression: Compression::Lz4,
                max_background_jobs: 1,
                wal_max_total_bytes: 16 * MI,
                ..balanced
            },
            RocksDbProfile::Throughput => ResolvedRocksDb {
                block_cache_bytes: 256 * MI,
                write_buffer_bytes: 64 * MI,
                max_write_buffer_number: 4,
                memtable_budget_bytes: 512 * MI,
                standby_memtable_budget_bytes: 512 * MI / 4,
                block_size_bytes: 16 * 1024,
                compression: Compression::Lz4,
                max_background_jobs: 4,
                wal_max_total_bytes: 256 * MI,
                ..balanced
            },
        }
    }

    /// Memory RocksDB may use outside any heap, however many stores the pod has: the shared
    /// block cache plus the shared memtable budget.
    pub fn rocksdb_memory_bytes(&self) -> u64 {
        self.block_cache_bytes + self.memtable_budget_bytes
    }

    /// Memory the processor container needs with `processing_threads` threads: RocksDB's
    /// share plus the process itself (librdkafka's bounded queues, buffers, the runtime). The
    /// operator checks a spec's memory limit against this.
    pub fn container_memory_bytes(&self, processing_threads: u32) -> u64 {
        self.rocksdb_memory_bytes() + process_overhead_bytes(processing_threads)
    }

    /// How the memtable budget is split: (active stores, standby and warm-up stores). With
    /// standbys the standby part is kept apart, so their catching up never stalls an active
    /// store's writes; the two parts add up to the budget, so the pod's memory stays the same.
    pub fn memtable_budgets(&self, standbys: bool) -> (u64, u64) {
        if standbys {
            (
                self.memtable_budget_bytes - self.standby_memtable_budget_bytes,
                self.standby_memtable_budget_bytes,
            )
        } else {
            (self.memtable_budget_bytes, 0)
        }
    }
}

impl RocksDbTuning {
    /// Applies the set knobs over the profile's values. Errors name the field.
    pub fn resolve(&self) -> Result<ResolvedRocksDb, ConfigError> {
        let mut r = ResolvedRocksDb::profile(self.profile.unwrap_or_default());
        let q = |field: &str, v: &Option<String>, into: &mut u64| -> Result<(), ConfigError> {
            if let Some(v) = v {
                *into = parse_quantity(v).map_err(|e| ConfigError::field(field, e))?;
            }
            Ok(())
        };
        q(
            "rocksdb.blockCacheSize",
            &self.block_cache_size,
            &mut r.block_cache_bytes,
        )?;
        q(
            "rocksdb.writeBufferSize",
            &self.write_buffer_size,
            &mut r.write_buffer_bytes,
        )?;
        q(
            "rocksdb.blockSize",
            &self.block_size,
            &mut r.block_size_bytes,
        )?;
        q(
            "rocksdb.memtableBudget",
            &self.memtable_budget,
            &mut r.memtable_budget_bytes,
        )?;
        r.standby_memtable_budget_bytes = r.memtable_budget_bytes / 4;
        q(
            "rocksdb.standbyMemtableBudget",
            &self.standby_memtable_budget,
            &mut r.standby_memtable_budget_bytes,
        )?;
        if let Some(n) = self.max_write_buffer_number {
            r.max_write_buffer_number = n;
        }
        if let Some(n) = self.bloom_filter_bits_per_key {
            r.bloom_filter_bits_per_key = n;
        }
        if let Some(c) = self.compression {
            r.compression = c;
        }
        if let Some(c) = self.compaction_style {
            r.compaction_style = c;
        }
        if let Some(n) = self.max_background_jobs {
            r.max_background_jobs = n;
        }
        if let Some(wal) = &self.wal {
            if let Some(v) = wal.enabled {
                r.wal_enabled = v;
            }
            if let Some(v) = wal.recovery_mode {
                r.wal_recovery_mode = v;
            }
            if let Some(v) = wal.ttl_seconds {
                r.wal_ttl_seconds = u64::try_from(v).map_err(|_| {
                    ConfigError::field("rocksdb.wal.ttlSeconds", "must not be negative")
                })?;
            }
            if let Some(v) = wal.size_limit_mb {
                r.wal_size_limit_mb = u64::try_from(v).map_err(|_| {
                    ConfigError::field("rocksdb.wal.sizeLimitMb", "must not be negative")
                })?;
            }
            q(
                "rocksdb.wal.maxTotalSize",
                &wal.max_total_size,
                &mut r.wal_max_total_bytes,
            )?;
            if let Some(v) = wal.sync_on_commit {
                r.wal_sync_on_commit = v;
            }
        }
        if let Some(v) = &self.verification {
            if let Some(n) = v.interval_seconds {
                r.verify_interval_seconds = u64::try_from(n).map_err(|_| {
                    ConfigError::field(
                        "rocksdb.verification.intervalSeconds",
                        "must not be negative",
                    )
                })?;
            }
            if let Some(n) = v.keys_per_second {
                r.verify_keys_per_second = u64::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1000)
                    .ok_or_else(|| {
                        ConfigError::field(
                            "rocksdb.verification.keysPerSecond",
                            "must be at least 1000",
                        )
                    })?;
            }
        }
        if r.compaction_style == CompactionStyle::Fifo {
            return Err(ConfigError::field(
                "rocksdb.compactionStyle",
                "Fifo deletes the oldest SST files and with them ids the store still vouches for, \
                 so repeats would be output as first occurrences; use Level (default) or Universal",
            ));
        }
        if r.wal_recovery_mode == WalRecoveryMode::SkipAnyCorruptedRecords {
            return Err(ConfigError::field(
                "rocksdb.wal.recoveryMode",
                "SkipAnyCorruptedRecords can leave holes in the store that no offset reveals; \
                 use PointInTime (recommended), TolerateCorruptedTailRecords or AbsoluteConsistency",
            ));
        }
        if !(2..=16).contains(&r.max_write_buffer_number) {
            return Err(ConfigError::field(
                "rocksdb.maxWriteBufferNumber",
                "must be between 2 and 16",
            ));
        }
        if r.block_size_bytes < 1024 {
            return Err(ConfigError::field(
                "rocksdb.blockSize",
                "must be at least 1Ki",
            ));
        }
        if r.write_buffer_bytes < (1 << 20) {
            return Err(ConfigError::field(
                "rocksdb.writeBufferSize",
                "must be at least 1Mi",
            ));
        }
        if r.memtable_budget_bytes < r.write_buffer_bytes {
            return Err(ConfigError::field(
                "rocksdb.memtableBudget",
                "must be at least rocksdb.writeBufferSize",
            ));
        }
        if r.standby_memtable_budget_bytes == 0
            || r.standby_memtable_budget_bytes >= r.memtable_budget_bytes
        {
            return Err(ConfigError::field(
                "rocksdb.standbyMemtableBudget",
                "must be more than 0 and less than rocksdb.memtableBudget (it is a part of it)",
            ));
        }
        Ok(r)
    }
}

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

/// How the processor reaches Kafka.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KafkaClient {
    /// Comma-separated `host:port` list.
    #[schemars(length(min = 1))]
    pub bootstrap_servers: String,
    /// Extra librdkafka client properties passed through as they are (for example
    /// `security.protocol`, `sasl.mechanism`, `ssl.ca.location`). Properties the processor
    /// owns for exactly-once and its rebalance handling ([`RESERVED_KAFKA_PROPERTIES`]) are
    /// refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

/// A SASL mechanism the state-aware group membership (`standbyReplicas` ≥ 1) speaks on its own
/// connections, beside librdkafka's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl SaslMechanism {
    pub const ALL: [SaslMechanism; 3] = [
        SaslMechanism::Plain,
        SaslMechanism::ScramSha256,
        SaslMechanism::ScramSha512,
    ];

    /// Its name in Kafka's protocol and in librdkafka's `sasl.mechanism`.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// How the state-aware group membership connects, read from the Kafka client settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembershipConnection {
    pub tls: bool,
    /// `None`: no SASL.
    pub sasl: Option<SaslMechanism>,
}

/// How the state-aware group membership connects, or the first client setting it cannot
/// honour with why (`(property, why)`). It speaks TLS (CA and client certificate as PEM, host
/// names checked) and SASL PLAIN and SCRAM, as librdkafka does; anything that would have it
/// connect differently from the rest of the processor is refused. `get` reads a client
/// property. Checked when the configuration is validated and again by the processor when it
/// connects.
pub fn membership_connection<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<MembershipConnection, (String, String)> {
    let get = |k: &str| get(k).map(str::trim).filter(|v| !v.is_empty());
    let refuse = |key: &str, why: String| Err((key.to_string(), why));
    for (key, why) in [
        (
            "ssl.keystore.location",
            "use PEM files (ssl.certificate.location, ssl.key.location)",
        ),
        ("ssl.key.password", "use an unencrypted PEM key"),
        (
            "ssl.engine.location",
            "OpenSSL engines are librdkafka's only",
        ),
        ("ssl.providers", "OpenSSL providers are librdkafka's only"),
    ] {
        if get(key).is_some() {
            return refuse(key, format!("is not supported with standbys: {why}"));
        }
    }
    let protocol = get("security.protocol").unwrap_or("plaintext");
    let (tls, sasl) = match protocol.to_ascii_lowercase().as_str() {
        "plaintext" => (false, false),
        "ssl" => (true, false),
        "sasl_plaintext" => (false, true),
        "sasl_ssl" => (true, true),
        other => {
            return refuse(
                "security.protocol",
                format!("{other} is not a security protocol"),
            );
        }
    };
    let sasl = if sasl {
        let (key, name) = match (get("sasl.mechanism"), get("sasl.mechanisms")) {
            (Some(m), _) => ("sasl.mechanism", m),
            (None, Some(m)) => ("sasl.mechanisms", m),
            (None, None) => ("sasl.mechanism", "GSSAPI"),
        };
        let Some(mechanism) = SaslMechanism::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
        else {
            let spoken: Vec<&str> = SaslMechanism::ALL.iter().map(|m| m.name()).collect();
            return refuse(
                key,
                format!(
                    "{name} is not supported with standbys (the group membership speaks {})",
                    spoken.join(", ")
                ),
            );
        };
        Some(mechanism)
    } else {
        None
    };
    if let Some(a) = get("ssl.endpoint.identification.algorithm")
        && !a.eq_ignore_ascii_case("https")
    {
        return refuse(
            "ssl.endpoint.identification.algorithm",
            format!(
                "{a} is not supported with standbys: the group membership checks that the \
                 broker's certificate names the host or IP address it connects to"
            ),
        );
    }
    if get("enable.ssl.certificate.verification").is_some_and(|v| v.eq_ignore_ascii_case("false")) {
        return refuse(
            "enable.ssl.certificate.verification",
            "false is not supported with standbys: give the CA (kafka.tls)".into(),
        );
    }
    Ok(MembershipConnection { tls, sasl })
}

/// Client properties the processor sets itself: overriding them would break exactly-once or
/// the processor's handling of rebalances.
///
/// - read_committed, transactions and idempotence: `isolation.level`, `transactional.id`,
///   `enable.idempotence`, `acks`;
/// - offsets are committed inside transactions only: `enable.auto.commit`,
///   `enable.auto.offset.store`, `auto.offset.reset`;
/// - identity: `group.id`, `group.instance.id`, `bootstrap.servers` (from
///   `kafka.bootstrapServers`);
/// - rebalances are handled eagerly (revoke everything, then assign): `group.protocol`
///   (KIP-848's `consumer` protocol makes them incremental), `group.remote.assignor`,
///   `partition.assignment.strategy` (`cooperative-sticky` is incremental too);
/// - the loop treats partition-end events as errors: `enable.partition.eof`.
pub const RESERVED_KAFKA_PROPERTIES: &[&str] = &[
    "isolation.level",
    "transactional.id",
    "enable.idempotence",
    "acks",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "group.id",
    "group.instance.id",
    "bootstrap.servers",
    "group.protocol",
    "group.remote.assignor",
    "partition.assignment.strategy",
    "enable.partition.eof",
];

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

/// The topology with its durations and sizes parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedTopology {
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

    /// Checks what the schema cannot and parses durations. Errors name the field.
    pub fn resolve(&self) -> Result<ResolvedTopology, ConfigError> {
        let retention = parse_duration(&self.retention)
            .map_err(|e| ConfigError::field("topology.retention", e))?;
        let commit_interval = parse_duration(&self.commit_interval)
            .map_err(|e| ConfigError::field("topology.commitInterval", e))?;
        let max_value_bytes = parse_quantity(&self.max_value_size)
            .map_err(|e| ConfigError::field("topology.maxValueSize", e))?;
        let max_skew = parse_duration(&self.max_skew)
            .map_err(|e| ConfigError::field("topology.maxSkew", e))?;
        if commit_interval.is_zero() {
            return Err(ConfigError::field(
                "topology.commitInterval",
                "must be greater than 0",
            ));
        }
        if retention <= commit_interval {
            return Err(ConfigError::field(
                "topology.retention",
                "must be greater than topology.commitInterval",
            ));
        }
        if max_skew >= retention {
            return Err(ConfigError::field(
                "topology.maxSkew",
                "must be less than topology.retention (ids are remembered for retention minus maxSkew at least)",
            ));
        }
        if !(1..=100).contains(&self.max_record_attempts) {
            return Err(ConfigError::field(
                "topology.maxRecordAttempts",
                "must be between 1 and 100",
            ));
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
                return Err(ConfigError::field(field, why));
            }
            if let Some((other, _)) = topics[..i].iter().find(|(_, t)| t == topic) {
                return Err(ConfigError::field(
                    field,
                    format!("must differ from {other} (both are {topic:?})"),
                ));
            }
        }
        match self.dedup_id.source {
            DedupIdSource::Header if self.dedup_id.header.as_deref().unwrap_or("").is_empty() => {
                return Err(ConfigError::field(
                    "topology.dedupId.header",
                    "is required when source is Header",
                ));
            }
            DedupIdSource::JsonPointer => {
                let p = self.dedup_id.json_pointer.as_deref().unwrap_or("");
                if !p.starts_with('/') {
                    return Err(ConfigError::field(
                        "topology.dedupId.jsonPointer",
                        "is required when source is JsonPointer and must start with '/' (e.g. /commandId)",
                    ));
                }
            }
            _ => {}
        }
        Ok(ResolvedTopology {
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

    /// The compacted topic the dedup store is backed by.
    pub fn changelog_topic(&self) -> String {
        format!("{}-dedup-changelog", self.application_id)
    }

    /// The internal topic the first stage writes records keyed by their dedup id to, when the
    /// topology repartitions ([`Topology::repartitions`]).
    pub fn repartition_topic(&self) -> Option<String> {
        self.topology
            .repartitions()
            .then(|| format!("{}-dedup-repartition", self.application_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology() -> Topology {
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
    fn max_skew_must_be_less_than_the_retention() {
        let t = Topology {
            max_skew: "1h".into(),
            ..topology()
        };
        assert_eq!(t.resolve().unwrap_err().field, "topology.maxSkew");
        let t = Topology {
            max_record_attempts: 0,
            ..topology()
        };
        assert_eq!(t.resolve().unwrap_err().field, "topology.maxRecordAttempts");
    }

    #[test]
    fn fifo_compaction_is_refused_because_it_drops_ids_the_store_vouches_for() {
        let tuning = RocksDbTuning {
            compaction_style: Some(CompactionStyle::Fifo),
            ..Default::default()
        };
        let e = tuning.resolve().unwrap_err();
        assert_eq!(e.field, "rocksdb.compactionStyle");
        assert!(e.message.contains("Level"), "{e}");
        for allowed in [CompactionStyle::Level, CompactionStyle::Universal] {
            let tuning = RocksDbTuning {
                compaction_style: Some(allowed),
                ..Default::default()
            };
            assert_eq!(tuning.resolve().unwrap().compaction_style, allowed);
        }
    }

    #[test]
    fn verification_defaults_to_daily_at_half_a_million_keys_a_second_and_refuses_nonsense() {
        let r = RocksDbTuning::default().resolve().unwrap();
        assert_eq!(r.verify_interval_seconds, 86_400);
        assert_eq!(r.verify_keys_per_second, 500_000);
        let tuning = |interval_seconds, keys_per_second| RocksDbTuning {
            verification: Some(VerificationTuning {
                interval_seconds,
                keys_per_second,
            }),
            ..Default::default()
        };
        let r = tuning(Some(0), Some(2000)).resolve().unwrap();
        assert_eq!(
            (r.verify_interval_seconds, r.verify_keys_per_second),
            (0, 2000)
        );
        let e = tuning(Some(-1), None).resolve().unwrap_err();
        assert_eq!(e.field, "rocksdb.verification.intervalSeconds");
        let e = tuning(None, Some(10)).resolve().unwrap_err();
        assert_eq!(e.field, "rocksdb.verification.keysPerSecond");
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
    fn retention_must_exceed_commit_interval() {
        let t = Topology {
            retention: "100ms".into(),
            ..topology()
        };
        assert_eq!(t.resolve().unwrap_err().field, "topology.retention");
    }

    #[test]
    fn topics_must_be_distinct() {
        let t = Topology {
            output_topic: "in".into(),
            ..topology()
        };
        let e = t.resolve().unwrap_err();
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
                t.resolve().unwrap_err().field,
                "topology.outputTopic",
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
        assert_eq!(t.resolve().unwrap_err().field, "topology.dedupId.header");
    }

    #[test]
    fn skip_any_corrupted_records_is_refused() {
        let tuning = RocksDbTuning {
            wal: Some(WalTuning {
                recovery_mode: Some(WalRecoveryMode::SkipAnyCorruptedRecords),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            tuning.resolve().unwrap_err().field,
            "rocksdb.wal.recoveryMode"
        );
    }

    #[test]
    fn set_knobs_override_the_profile() {
        let tuning = RocksDbTuning {
            profile: Some(RocksDbProfile::LowMemory),
            block_cache_size: Some("8Mi".into()),
            ..Default::default()
        };
        let r = tuning.resolve().unwrap();
        assert_eq!(r.block_cache_bytes, 8 << 20);
        assert_eq!(r.write_buffer_bytes, 4 << 20, "from the LowMemory profile");
        assert_eq!(r.rocksdb_memory_bytes(), (8 << 20) + (32 << 20));
    }

    #[test]
    fn standbys_get_a_part_of_the_memtable_budget_not_more_memory() {
        let tuning = RocksDbTuning {
            memtable_budget: Some("64Mi".into()),
            ..Default::default()
        };
        let r = tuning.resolve().unwrap();
        assert_eq!(r.memtable_budgets(false), (64 << 20, 0));
        assert_eq!(
            r.memtable_budgets(true),
            (48 << 20, 16 << 20),
            "a quarter of the budget set, not of the profile's"
        );
        assert_eq!(r.rocksdb_memory_bytes(), r.block_cache_bytes + (64 << 20));

        let tuning = RocksDbTuning {
            standby_memtable_budget: Some("100Mi".into()),
            ..Default::default()
        };
        let r = tuning.resolve().unwrap();
        assert_eq!(r.memtable_budgets(true), (28 << 20, 100 << 20));

        let tuning = RocksDbTuning {
            standby_memtable_budget: Some("128Mi".into()),
            ..Default::default()
        };
        assert_eq!(
            tuning.resolve().unwrap_err().field,
            "rocksdb.standbyMemtableBudget",
            "the whole budget leaves nothing to the active stores"
        );
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
