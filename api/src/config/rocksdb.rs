//! RocksDB tuning: the profiles, the knobs a user may set over them, and the memory a
//! processor container needs for its stores and its Kafka clients.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigErrors;
use crate::units::parse_quantity;

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
    /// fsync the WAL each time a committed transaction is applied (default false: the store
    /// records the changelog offset it reflects in the same batch as its data, so a power loss
    /// that takes the unsynced tail leaves a consistent earlier store, and the changelog is
    /// replayed from its offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_on_commit: Option<bool>,
}

/// Memory of the processor beyond RocksDB and its processing threads' Kafka clients: HTTP, the
/// runtime, the rest of the process.
pub const PROCESS_BASE_BYTES: u64 = 112 << 20;
/// Memory of each processing thread's Kafka clients: librdkafka's producer and consumer queues
/// (the engine bounds them to 64 MiB and 4 MiB).
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
            // Not per commit: the changelog is the durable copy (see `sync_on_commit`).
            wal_sync_on_commit: false,
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
    /// Applies the set knobs over the profile's values. The errors name their fields, all of
    /// them: the checks between sizes run only when every size parsed.
    pub fn resolve(&self) -> Result<ResolvedRocksDb, ConfigErrors> {
        let mut errors = ConfigErrors::default();
        let mut r = ResolvedRocksDb::profile(self.profile.unwrap_or_default());
        let before_sizes = errors.len();
        set_size(
            &mut errors,
            "rocksdb.blockCacheSize",
            &self.block_cache_size,
            &mut r.block_cache_bytes,
        );
        set_size(
            &mut errors,
            "rocksdb.writeBufferSize",
            &self.write_buffer_size,
            &mut r.write_buffer_bytes,
        );
        set_size(
            &mut errors,
            "rocksdb.blockSize",
            &self.block_size,
            &mut r.block_size_bytes,
        );
        set_size(
            &mut errors,
            "rocksdb.memtableBudget",
            &self.memtable_budget,
            &mut r.memtable_budget_bytes,
        );
        r.standby_memtable_budget_bytes = r.memtable_budget_bytes / 4;
        set_size(
            &mut errors,
            "rocksdb.standbyMemtableBudget",
            &self.standby_memtable_budget,
            &mut r.standby_memtable_budget_bytes,
        );
        if let Some(wal) = &self.wal {
            set_size(
                &mut errors,
                "rocksdb.wal.maxTotalSize",
                &wal.max_total_size,
                &mut r.wal_max_total_bytes,
            );
        }
        let sizes_parsed = errors.len() == before_sizes;
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
            set_non_negative(
                &mut errors,
                "rocksdb.wal.ttlSeconds",
                wal.ttl_seconds,
                &mut r.wal_ttl_seconds,
            );
            set_non_negative(
                &mut errors,
                "rocksdb.wal.sizeLimitMb",
                wal.size_limit_mb,
                &mut r.wal_size_limit_mb,
            );
            if let Some(v) = wal.sync_on_commit {
                r.wal_sync_on_commit = v;
            }
        }
        if let Some(v) = &self.verification {
            set_non_negative(
                &mut errors,
                "rocksdb.verification.intervalSeconds",
                v.interval_seconds,
                &mut r.verify_interval_seconds,
            );
            if let Some(n) = v.keys_per_second {
                match u64::try_from(n).ok().filter(|&n| n >= 1000) {
                    Some(n) => r.verify_keys_per_second = n,
                    None => errors.push(
                        "rocksdb.verification.keysPerSecond",
                        "must be at least 1000",
                    ),
                }
            }
        }
        if r.compaction_style == CompactionStyle::Fifo {
            errors.push(
                "rocksdb.compactionStyle",
                "Fifo deletes the oldest SST files and with them ids the store still vouches for, \
                 so repeats would be output as first occurrences; use Level (default) or Universal",
            );
        }
        if r.wal_recovery_mode == WalRecoveryMode::SkipAnyCorruptedRecords {
            errors.push(
                "rocksdb.wal.recoveryMode",
                "SkipAnyCorruptedRecords can leave holes in the store that no offset reveals; \
                 use PointInTime (recommended), TolerateCorruptedTailRecords or AbsoluteConsistency",
            );
        }
        if !(2..=16).contains(&r.max_write_buffer_number) {
            errors.push("rocksdb.maxWriteBufferNumber", "must be between 2 and 16");
        }
        if r.block_size_bytes < 1024 {
            errors.push("rocksdb.blockSize", "must be at least 1Ki");
        }
        if r.write_buffer_bytes < (1 << 20) {
            errors.push("rocksdb.writeBufferSize", "must be at least 1Mi");
        }
        if sizes_parsed && r.memtable_budget_bytes < r.write_buffer_bytes {
            errors.push(
                "rocksdb.memtableBudget",
                "must be at least rocksdb.writeBufferSize",
            );
        }
        if sizes_parsed
            && (r.standby_memtable_budget_bytes == 0
                || r.standby_memtable_budget_bytes >= r.memtable_budget_bytes)
        {
            errors.push(
                "rocksdb.standbyMemtableBudget",
                "must be more than 0 and less than rocksdb.memtableBudget (it is a part of it)",
            );
        }
        errors.or_ok(r)
    }
}

/// Sets `into` to the size `value` (a quantity) if it is given; notes the error if it does not
/// parse, and leaves the profile's value.
fn set_size(errors: &mut ConfigErrors, field: &str, value: &Option<String>, into: &mut u64) {
    if let Some(v) = value
        && let Some(bytes) = errors.check(field, parse_quantity(v))
    {
        *into = bytes;
    }
}

/// Sets `into` to `value` (seconds, megabytes) if it is given; notes the error if it is
/// negative.
fn set_non_negative(errors: &mut ConfigErrors, field: &str, value: Option<i64>, into: &mut u64) {
    if let Some(v) = value
        && let Some(v) = errors.check(field, u64::try_from(v).map_err(|_| "must not be negative"))
    {
        *into = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_compaction_is_refused_because_it_drops_ids_the_store_vouches_for() {
        let tuning = RocksDbTuning {
            compaction_style: Some(CompactionStyle::Fifo),
            ..Default::default()
        };
        let errors = tuning.resolve().unwrap_err();
        assert_eq!(errors.fields(), ["rocksdb.compactionStyle"]);
        let e = errors.iter().next().unwrap();
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
        let e = tuning(Some(-1), Some(10)).resolve().unwrap_err();
        assert_eq!(
            e.fields(),
            [
                "rocksdb.verification.intervalSeconds",
                "rocksdb.verification.keysPerSecond"
            ]
        );
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
            tuning.resolve().unwrap_err().fields(),
            ["rocksdb.wal.recoveryMode"]
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
    fn the_wal_is_written_but_synced_per_commit_only_when_asked() {
        let default = RocksDbTuning::default().resolve().unwrap();
        assert!(default.wal_enabled);
        assert!(!default.wal_sync_on_commit);
        let asked = RocksDbTuning {
            wal: Some(WalTuning {
                sync_on_commit: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(asked.resolve().unwrap().wal_sync_on_commit);
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
            tuning.resolve().unwrap_err().fields(),
            ["rocksdb.standbyMemtableBudget"],
            "the whole budget leaves nothing to the active stores"
        );
    }
}
