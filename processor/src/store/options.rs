//! RocksDB options of a task store, from the resolved tuning, and the memory every store of a
//! process shares (one block cache, one memtable budget split between active and standby
//! stores).

use std::path::Path;
use std::sync::{Arc, Mutex};

use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, DBCompactionStyle, DBCompressionType,
    DBRecoveryMode, Options, WriteBufferManager,
};
use streamapp_api::config::{CompactionStyle, Compression, ResolvedRocksDb, WalRecoveryMode};

/// Files in level 0 that start a compaction into the level below (RocksDB's default; set here
/// so that a bulk load, which raises it while it lasts, has a value to give back, `ingest.rs`).
pub(super) const L0_COMPACTION_TRIGGER: i32 = 4;
/// Files in level 0 at which RocksDB slows writes down (its default).
pub(super) const L0_SLOWDOWN_WRITES_TRIGGER: i32 = 20;

/// Whose memtable budget a store's writes count against. A store is opened for one role; a
/// standby promoted to active (or the reverse) is reopened for the other
/// ([`super::TaskStore::reopen`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryRole {
    Active,
    /// Standby and warm-up stores: written only by the state updater's follower.
    Standby,
}

/// The memory all stores of a process share: one block cache and one memtable budget, so the
/// process's RocksDB memory does not grow with the number of tasks. With standbys the budget
/// is two write-buffer managers, one per [`MemoryRole`]: a standby catching up stalls (and
/// flushes) only standby stores, never an active store's writes.
#[derive(Clone)]
pub struct SharedMemory {
    cache: Cache,
    active_write_buffers: WriteBufferManager,
    standby_write_buffers: WriteBufferManager,
    /// The budgets as configured: (active, standby); standby 0 without standbys.
    budgets: (u64, u64),
    /// Bytes of each budget held outside the memtables ([`SharedMemory::reserve`]):
    /// (active, standby).
    reserved: Arc<Mutex<(u64, u64)>>,
}

/// Part of a role's memtable budget held for memory outside the memtables (a restore's runs,
/// `ingest.rs`): while it is held, the role's write-buffer manager is that much smaller, so
/// memtables and what holds it stay within the budget together. Given back when dropped.
pub struct Reservation {
    memory: SharedMemory,
    role: MemoryRole,
    bytes: u64,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.memory.resize(self.role, |held| held - self.bytes);
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({:?}, {} bytes)", self.role, self.bytes)
    }
}

impl SharedMemory {
    pub fn new(tuning: &ResolvedRocksDb, standbys: bool) -> Self {
        let (active, standby) = tuning.memtable_budgets(standbys);
        // Writers stall rather than exceed their budget.
        let budget =
            |bytes: u64| WriteBufferManager::new_write_buffer_manager(bytes as usize, true);
        SharedMemory {
            cache: Cache::new_lru_cache(tuning.block_cache_bytes as usize),
            active_write_buffers: budget(active),
            // Without standbys no store is opened for this role; a budget of 0 would mean
            // "unlimited" to RocksDB, so it gets the smallest memtable's worth instead.
            standby_write_buffers: budget(standby.max(tuning.write_buffer_bytes)),
            budgets: (active, standby),
            reserved: Arc::new(Mutex::new((0, 0))),
        }
    }

    /// Takes up to `wanted` bytes of `role`'s memtable budget for memory outside the
    /// memtables, always leaving `keep` to the memtables; the reservation may hold less than
    /// wanted, or nothing.
    pub fn reserve(&self, role: MemoryRole, wanted: u64, keep: u64) -> Reservation {
        let budget = self.memtable_budget(role);
        let mut bytes = 0;
        self.resize(role, |held| {
            bytes = wanted.min(budget.saturating_sub(keep).saturating_sub(held));
            held + bytes
        });
        Reservation {
            memory: self.clone(),
            role,
            bytes,
        }
    }

    /// Changes what `role`'s reservations hold, and its write-buffer manager's size with it.
    fn resize(&self, role: MemoryRole, held: impl FnOnce(u64) -> u64) {
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match role {
            MemoryRole::Active => &mut reserved.0,
            MemoryRole::Standby => &mut reserved.1,
        };
        *slot = held(*slot);
        let budget = self.memtable_budget(role);
        if budget > 0 {
            // Never 0, which RocksDB takes for no limit at all.
            let size = budget.saturating_sub(*slot).max(1);
            self.write_buffers(role).set_buffer_size(size as usize);
        }
    }

    fn write_buffers(&self, role: MemoryRole) -> &WriteBufferManager {
        match role {
            MemoryRole::Active => &self.active_write_buffers,
            MemoryRole::Standby => &self.standby_write_buffers,
        }
    }

    /// Bytes of memtables counted against `role`'s budget now.
    pub fn memtable_bytes(&self, role: MemoryRole) -> usize {
        self.write_buffers(role).get_usage()
    }

    /// `role`'s memtable budget in bytes (0 for standbys when the process has none).
    pub fn memtable_budget(&self, role: MemoryRole) -> u64 {
        match role {
            MemoryRole::Active => self.budgets.0,
            MemoryRole::Standby => self.budgets.1,
        }
    }
}

/// RocksDB options from the resolved tuning, sharing memory with every other store of the
/// same role.
pub fn rocksdb_options(
    tuning: &ResolvedRocksDb,
    memory: &SharedMemory,
    role: MemoryRole,
    wal_dir: Option<&Path>,
) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&memory.cache);
    table.set_block_size(tuning.block_size_bytes as usize);
    if tuning.bloom_filter_bits_per_key > 0 {
        table.set_bloom_filter(tuning.bloom_filter_bits_per_key as f64, false);
    }
    // Index and filter blocks count against the shared cache, so memory stays bounded.
    table.set_cache_index_and_filter_blocks(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    // ... partitioned: a full filter block of a large SST is megabytes, bigger than a shard
    // of the cache, so it was never kept and every lookup read it from disk and checksummed
    // it again (a store of 5M ids fell to ~6,000 records/s, all of it in filter reads).
    // 4 KiB partitions stay cached; the small top level is pinned.
    table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(4096);
    table.set_pin_top_level_index_and_filter(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);

    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.set_write_buffer_manager(memory.write_buffers(role));
    opts.set_block_based_table_factory(&table);
    opts.set_write_buffer_size(tuning.write_buffer_bytes as usize);
    // Most lookups are of ids never seen (first occurrences): a bloom filter over the
    // memtables' whole keys answers those without walking each memtable's skip list.
    opts.set_memtable_whole_key_filtering(true);
    opts.set_memtable_prefix_bloom_ratio(0.1);
    opts.set_max_write_buffer_number(tuning.max_write_buffer_number);
    opts.set_level_zero_file_num_compaction_trigger(L0_COMPACTION_TRIGGER);
    opts.set_level_zero_slowdown_writes_trigger(L0_SLOWDOWN_WRITES_TRIGGER);
    opts.set_compression_type(match tuning.compression {
        Compression::None => DBCompressionType::None,
        Compression::Snappy => DBCompressionType::Snappy,
        Compression::Lz4 => DBCompressionType::Lz4,
        Compression::Zstd => DBCompressionType::Zstd,
    });
    opts.set_compaction_style(match tuning.compaction_style {
        CompactionStyle::Level => DBCompactionStyle::Level,
        CompactionStyle::Universal => DBCompactionStyle::Universal,
        // Refused by configuration validation (it drops live ids); never reached.
        CompactionStyle::Fifo => DBCompactionStyle::Level,
    });
    opts.set_max_background_jobs(tuning.max_background_jobs);
    opts.set_wal_recovery_mode(match tuning.wal_recovery_mode {
        WalRecoveryMode::TolerateCorruptedTailRecords => {
            DBRecoveryMode::TolerateCorruptedTailRecords
        }
        WalRecoveryMode::AbsoluteConsistency => DBRecoveryMode::AbsoluteConsistency,
        WalRecoveryMode::PointInTime => DBRecoveryMode::PointInTime,
        // Refused by configuration validation; never reached.
        WalRecoveryMode::SkipAnyCorruptedRecords => DBRecoveryMode::PointInTime,
    });
    opts.set_paranoid_checks(true);
    if let Some(dir) = wal_dir {
        opts.set_wal_dir(dir);
    }
    opts.set_wal_ttl_seconds(tuning.wal_ttl_seconds);
    opts.set_wal_size_limit_mb(tuning.wal_size_limit_mb);
    opts.set_max_total_wal_size(tuning.wal_max_total_bytes);
    opts.set_keep_log_file_num(3);
    opts
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::config::RocksDbProfile;

    #[test]
    fn a_reservation_shrinks_the_memtables_budget_while_it_is_held() {
        let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
        let memory = SharedMemory::new(&tuning, true);
        let (active, standby) = tuning.memtable_budgets(true);
        let size = |role| memory.write_buffers(role).get_buffer_size() as u64;
        let first = memory.reserve(MemoryRole::Active, 5 << 20, 0);
        assert_eq!(first.bytes(), 5 << 20);
        assert_eq!(size(MemoryRole::Active), active - (5 << 20));
        assert_eq!(
            size(MemoryRole::Standby),
            standby,
            "the other role's is its own"
        );
        let rest = memory.reserve(MemoryRole::Active, u64::MAX, 1 << 20);
        assert_eq!(
            rest.bytes(),
            active - (5 << 20) - (1 << 20),
            "all but what is kept"
        );
        assert_eq!(memory.reserve(MemoryRole::Active, 1, 1 << 20).bytes(), 0);
        drop(first);
        assert_eq!(size(MemoryRole::Active), (5 << 20) + (1 << 20));
        drop(rest);
        assert_eq!(size(MemoryRole::Active), active);
    }
}
