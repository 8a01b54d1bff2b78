//! The dedup store of one task: a RocksDB database that only ever holds committed data.
//!
//! Writes of the open Kafka transaction are staged in memory ([`Staged`]) and reach RocksDB
//! only through [`TaskStore::apply`], which the engine calls after the transaction committed
//! (and restore calls with records read from the changelog under read_committed). `apply` writes
//! the data, the changelog offset it reflects and the expiry of old ids in one atomic
//! `WriteBatch`, so after any crash the store is a consistent prefix of the changelog.
//!
//! Layout (one column family, so one batch is atomic without atomic_flush):
//! - `i/<id>`        → first-seen record time (i64, big endian)
//! - `t/<time><id>`  → empty; the expiry index, ordered by time
//! - `m/<name>`      → metadata: changelog offset, input offset, stream time, expired-through

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, DB, DBCompactionStyle, DBCompressionType,
    DBRecoveryMode, IteratorMode, Options, ReadOptions, WriteBatch, WriteBufferManager,
    WriteOptions,
};
use streamapp_api::config::{CompactionStyle, Compression, ResolvedRocksDb, WalRecoveryMode};

const META_CHANGELOG_OFFSET: &[u8] = b"m/changelog_offset";
const META_INPUT_OFFSET: &[u8] = b"m/input_offset";
const META_STREAM_TIME: &[u8] = b"m/stream_time";
const META_EXPIRED_THROUGH: &[u8] = b"m/expired_through";
const META_FORMAT: &[u8] = b"m/format";
const FORMAT_VERSION: &[u8] = b"1";
const ID_PREFIX: &[u8] = b"i/";
const TIME_PREFIX: &[u8] = b"t/";

/// Why a store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store's files are damaged (RocksDB reported corruption, a file is missing, or the
    /// metadata makes no sense): quarantine it and rebuild from the changelog.
    #[error("store {path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
    /// Anything else (I/O, configuration).
    #[error("store {path}: {source}")]
    Other {
        path: PathBuf,
        source: rocksdb::Error,
    },
}

impl StoreError {
    fn from_rocksdb(path: &Path, e: rocksdb::Error) -> Self {
        use rocksdb::ErrorKind::*;
        match e.kind() {
            Corruption | InvalidArgument | NotSupported | IOError => StoreError::Damaged {
                path: path.to_path_buf(),
                reason: e.into_string(),
            },
            _ => StoreError::Other {
                path: path.to_path_buf(),
                source: e,
            },
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The offsets and clocks a store reflects, stored in the same batches as its data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreMeta {
    /// Next changelog offset not yet applied.
    pub changelog_offset: Option<i64>,
    /// Next input offset, as of the last applied transaction.
    pub input_offset: Option<i64>,
    /// Largest record time applied.
    pub stream_time: Option<i64>,
    /// Expiry index entries older than this were removed.
    pub expired_through: Option<i64>,
}

/// Writes of one open transaction (or one restore chunk), not yet in RocksDB.
#[derive(Clone, Debug, Default)]
pub struct Staged {
    /// id → first-seen record time.
    pub puts: BTreeMap<Vec<u8>, i64>,
    /// Changelog offset the store reflects once these are applied.
    pub changelog_offset: Option<i64>,
    /// Input offset the store reflects once these are applied.
    pub input_offset: Option<i64>,
    /// Largest record time among these.
    pub stream_time: Option<i64>,
}

impl Staged {
    /// Stages a put; an id put twice keeps its latest time (as [`TaskStore::apply`] does).
    pub fn put(&mut self, id: &[u8], time: i64) {
        let e = self.puts.entry(id.to_vec()).or_insert(time);
        *e = (*e).max(time);
        self.observe_time(time);
    }

    pub fn observe_time(&mut self, time: i64) {
        self.stream_time = Some(self.stream_time.map_or(time, |t| t.max(time)));
    }

    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.changelog_offset.is_none() && self.input_offset.is_none()
    }

    pub fn clear(&mut self) {
        *self = Staged::default();
    }
}

/// The memory all stores of a process share: one block cache and one memtable budget, so the
/// process's RocksDB memory does not grow with the number of tasks.
#[derive(Clone)]
pub struct SharedMemory {
    cache: Cache,
    write_buffers: WriteBufferManager,
}

impl SharedMemory {
    pub fn new(tuning: &ResolvedRocksDb) -> Self {
        SharedMemory {
            cache: Cache::new_lru_cache(tuning.block_cache_bytes as usize),
            // Writers stall rather than exceed the budget.
            write_buffers: WriteBufferManager::new_write_buffer_manager(
                tuning.memtable_budget_bytes as usize,
                true,
            ),
        }
    }
}

/// RocksDB options from the resolved tuning, sharing memory with every other store.
pub fn rocksdb_options(
    tuning: &ResolvedRocksDb,
    memory: &SharedMemory,
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
    opts.set_write_buffer_manager(&memory.write_buffers);
    opts.set_block_based_table_factory(&table);
    opts.set_write_buffer_size(tuning.write_buffer_bytes as usize);
    opts.set_max_write_buffer_number(tuning.max_write_buffer_number);
    opts.set_compression_type(match tuning.compression {
        Compression::None => DBCompressionType::None,
        Compression::Snappy => DBCompressionType::Snappy,
        Compression::Lz4 => DBCompressionType::Lz4,
        Compression::Zstd => DBCompressionType::Zstd,
    });
    opts.set_compaction_style(match tuning.compaction_style {
        CompactionStyle::Level => DBCompactionStyle::Level,
        CompactionStyle::Universal => DBCompactionStyle::Universal,
        CompactionStyle::Fifo => DBCompactionStyle::Fifo,
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

/// One task's store.
pub struct TaskStore {
    db: DB,
    path: PathBuf,
    wal_dir: PathBuf,
    retention_ms: i64,
    write_opts_sync: bool,
    wal_enabled: bool,
    meta: StoreMeta,
}

impl TaskStore {
    /// Opens (or creates) the store at `path`. RocksDB recovers its WAL with the configured
    /// recovery mode; any damage it reports comes back as [`StoreError::Damaged`].
    pub fn open(
        path: &Path,
        wal_dir: Option<&Path>,
        tuning: &ResolvedRocksDb,
        memory: &SharedMemory,
        retention: Duration,
    ) -> Result<Self> {
        std::fs::create_dir_all(path).map_err(|e| StoreError::Damaged {
            path: path.to_path_buf(),
            reason: format!("cannot create store directory: {e}"),
        })?;
        if let Some(w) = wal_dir {
            std::fs::create_dir_all(w).map_err(|e| StoreError::Damaged {
                path: path.to_path_buf(),
                reason: format!("cannot create WAL directory {}: {e}", w.display()),
            })?;
        }
        let opts = rocksdb_options(tuning, memory, wal_dir);
        let db = DB::open(&opts, path).map_err(|e| StoreError::from_rocksdb(path, e))?;
        let mut store = TaskStore {
            db,
            path: path.to_path_buf(),
            wal_dir: wal_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(|| path.to_path_buf()),
            retention_ms: retention.as_millis() as i64,
            write_opts_sync: tuning.wal_sync_on_commit,
            wal_enabled: tuning.wal_enabled,
            meta: StoreMeta::default(),
        };
        match store.get_raw(META_FORMAT)? {
            None => store
                .db
                .put(META_FORMAT, FORMAT_VERSION)
                .map_err(|e| StoreError::from_rocksdb(path, e))?,
            Some(v) if v == FORMAT_VERSION => {}
            Some(v) => {
                return Err(StoreError::Damaged {
                    path: path.to_path_buf(),
                    reason: format!("unknown store format {:?}", String::from_utf8_lossy(&v)),
                });
            }
        }
        store.meta = StoreMeta {
            changelog_offset: store.get_i64(META_CHANGELOG_OFFSET)?,
            input_offset: store.get_i64(META_INPUT_OFFSET)?,
            stream_time: store.get_i64(META_STREAM_TIME)?,
            expired_through: store.get_i64(META_EXPIRED_THROUGH)?,
        };
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn meta(&self) -> &StoreMeta {
        &self.meta
    }

    /// First-seen time of `id`, if the store remembers it.
    pub fn first_seen(&self, id: &[u8]) -> Result<Option<i64>> {
        self.get_i64(&id_key(id))
    }

    /// Applies committed writes, their offsets and the expiry they allow, atomically.
    ///
    /// The result does not depend on how writes are grouped into batches (a transaction while
    /// processing, a chunk while restoring): each id keeps the latest time it was put with,
    /// and every entry older than the retention before the newest stream time is gone.
    pub fn apply(&mut self, staged: &Staged) -> Result<()> {
        let mut batch = WriteBatch::default();
        let mut meta = self.meta.clone();
        if let Some(t) = staged.stream_time {
            meta.stream_time = Some(meta.stream_time.map_or(t, |s| s.max(t)));
        }
        let cutoff = meta
            .stream_time
            .map(|t| t.saturating_sub(self.retention_ms));
        // Expiry first: a put of this batch for an expiring id must win over its delete.
        if let Some(cutoff) = cutoff
            && meta.expired_through.is_none_or(|e| e < cutoff)
        {
            self.expire_into(&mut batch, meta.expired_through, cutoff)?;
            meta.expired_through = Some(cutoff);
        }
        for (id, &time) in &staged.puts {
            if cutoff.is_some_and(|c| time < c) {
                continue; // already outside the window: expired on arrival
            }
            if self.first_seen(id)?.is_some_and(|existing| existing > time) {
                continue; // a later put of the same id wins, whatever the order
            }
            batch.put(id_key(id), time.to_be_bytes());
            batch.put(time_key(time, id), []);
        }
        if let Some(o) = staged.changelog_offset {
            meta.changelog_offset = Some(o);
        }
        if let Some(o) = staged.input_offset {
            meta.input_offset = Some(o);
        }
        for (key, value) in [
            (META_CHANGELOG_OFFSET, meta.changelog_offset),
            (META_INPUT_OFFSET, meta.input_offset),
            (META_STREAM_TIME, meta.stream_time),
            (META_EXPIRED_THROUGH, meta.expired_through),
        ] {
            if let Some(v) = value {
                batch.put(key, v.to_be_bytes());
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.wal_enabled && self.write_opts_sync);
        wo.disable_wal(!self.wal_enabled);
        self.db
            .write_opt(batch, &wo)
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
        self.meta = meta;
        Ok(())
    }

    /// Adds deletes for expiry index entries in `[from, cutoff)` and the ids they still own.
    fn expire_into(&self, batch: &mut WriteBatch, from: Option<i64>, cutoff: i64) -> Result<()> {
        let mut ro = ReadOptions::default();
        // Start after what was already expired: iterating over old tombstones gets slow.
        let lower = time_key(from.unwrap_or(i64::MIN), b"");
        ro.set_iterate_lower_bound(lower.clone());
        ro.set_iterate_upper_bound(time_key(cutoff, b""));
        let iter = self
            .db
            .iterator_opt(IteratorMode::From(&lower, rocksdb::Direction::Forward), ro);
        for item in iter {
            let (key, _) = item.map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
            let (time, id) = parse_time_key(&key).ok_or_else(|| StoreError::Damaged {
                path: self.path.clone(),
                reason: "malformed expiry index key".into(),
            })?;
            batch.delete(&key);
            // The id may have been seen again later (a newer entry): keep it then.
            if self.first_seen(id)? == Some(time) {
                batch.delete(id_key(id));
            }
        }
        Ok(())
    }

    /// Flushes memtables to SST files and syncs the WAL: what a drain does before it writes
    /// the checkpoint.
    pub fn flush(&self) -> Result<()> {
        if self.wal_enabled {
            self.db
                .flush_wal(true)
                .map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
        }
        self.db
            .flush()
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))
    }

    /// Reads every key with checksums verified: finds damaged SST blocks that opening the
    /// store does not touch. Run after an unclean shutdown.
    pub fn verify(&self) -> Result<u64> {
        let mut ro = ReadOptions::default();
        ro.set_verify_checksums(true);
        ro.fill_cache(false);
        let mut n = 0;
        for item in self.db.iterator_opt(IteratorMode::Start, ro) {
            item.map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
            n += 1;
        }
        Ok(n)
    }

    /// Ids the store remembers (exact count; scans the id range).
    pub fn id_count(&self) -> Result<u64> {
        count_ids(&self.db, &self.path)
    }

    /// RocksDB's estimate of the number of keys (cheap).
    pub fn estimated_keys(&self) -> u64 {
        self.db
            .property_int_value("rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Bytes of live SST files.
    pub fn sst_bytes(&self) -> u64 {
        self.db
            .property_int_value("rocksdb.live-sst-files-size")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// The directory holding this store's WAL files.
    pub fn wal_dir(&self) -> &Path {
        &self.wal_dir
    }

    fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get(key)
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))
    }

    fn get_i64(&self, key: &[u8]) -> Result<Option<i64>> {
        match self.get_raw(key)? {
            None => Ok(None),
            Some(v) => {
                let bytes: [u8; 8] = v.as_slice().try_into().map_err(|_| StoreError::Damaged {
                    path: self.path.clone(),
                    reason: format!(
                        "value of {} is {} bytes, expected 8",
                        String::from_utf8_lossy(key),
                        v.len()
                    ),
                })?;
                Ok(Some(i64::from_be_bytes(bytes)))
            }
        }
    }
}

fn count_ids(db: &DB, path: &Path) -> Result<u64> {
    let mut ro = ReadOptions::default();
    ro.set_iterate_upper_bound(b"i0".to_vec()); // '0' sorts right after '/'
    ro.fill_cache(false);
    let mut n = 0;
    for item in db.iterator_opt(
        IteratorMode::From(ID_PREFIX, rocksdb::Direction::Forward),
        ro,
    ) {
        item.map_err(|e| StoreError::from_rocksdb(path, e))?;
        n += 1;
    }
    Ok(n)
}

fn id_key(id: &[u8]) -> Vec<u8> {
    [ID_PREFIX, id].concat()
}

/// `t/` + time with its sign bit flipped (so negative times sort first) + id.
fn time_key(time: i64, id: &[u8]) -> Vec<u8> {
    let sortable = (time as u64) ^ (1 << 63);
    [TIME_PREFIX, &sortable.to_be_bytes(), id].concat()
}

fn parse_time_key(key: &[u8]) -> Option<(i64, &[u8])> {
    let rest = key.strip_prefix(TIME_PREFIX)?;
    let (time, id) = rest.split_at_checked(8)?;
    let sortable = u64::from_be_bytes(time.try_into().ok()?);
    Some(((sortable ^ (1 << 63)) as i64, id))
}

/// What `inspect` reports of a store.
#[derive(Clone, Debug)]
pub struct StoreSummary {
    pub meta: StoreMeta,
    /// Ids the store remembers (exact: the id range is scanned).
    pub ids: u64,
    pub estimated_keys: u64,
    pub sst_bytes: u64,
}

/// Opens a store read-only (for `inspect`, beside a running processor).
pub fn open_read_only(path: &Path, wal_dir: Option<&Path>) -> Result<StoreSummary> {
    let mut opts = Options::default();
    if let Some(w) = wal_dir {
        opts.set_wal_dir(w);
    }
    let db = DB::open_for_read_only(&opts, path, false)
        .map_err(|e| StoreError::from_rocksdb(path, e))?;
    let get = |key: &[u8]| -> Option<i64> {
        db.get(key)
            .ok()
            .flatten()
            .and_then(|v| v.as_slice().try_into().ok())
            .map(i64::from_be_bytes)
    };
    let meta = StoreMeta {
        changelog_offset: get(META_CHANGELOG_OFFSET),
        input_offset: get(META_INPUT_OFFSET),
        stream_time: get(META_STREAM_TIME),
        expired_through: get(META_EXPIRED_THROUGH),
    };
    Ok(StoreSummary {
        meta,
        ids: count_ids(&db, path)?,
        estimated_keys: db
            .property_int_value("rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0),
        sst_bytes: db
            .property_int_value("rocksdb.live-sst-files-size")
            .ok()
            .flatten()
            .unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::config::RocksDbProfile;

    const HOUR: Duration = Duration::from_secs(3600);

    fn open(dir: &Path) -> TaskStore {
        let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
        TaskStore::open(dir, None, &tuning, &SharedMemory::new(&tuning), HOUR).unwrap()
    }

    #[test]
    fn staged_writes_are_invisible_until_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let mut staged = Staged::default();
        staged.put(b"cmd-1", 1_000);
        assert_eq!(
            store.first_seen(b"cmd-1").unwrap(),
            None,
            "staged, not applied"
        );
        staged.changelog_offset = Some(7);
        store.apply(&staged).unwrap();
        assert_eq!(store.first_seen(b"cmd-1").unwrap(), Some(1_000));
        assert_eq!(store.meta().changelog_offset, Some(7));
    }

    #[test]
    fn offsets_survive_reopen_with_the_data() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = open(dir.path());
            let mut staged = Staged::default();
            staged.put(b"a", 5);
            staged.changelog_offset = Some(3);
            staged.input_offset = Some(10);
            store.apply(&staged).unwrap();
        }
        let store = open(dir.path());
        assert_eq!(
            store.meta(),
            &StoreMeta {
                changelog_offset: Some(3),
                input_offset: Some(10),
                stream_time: Some(5),
                expired_through: Some(5 - HOUR.as_millis() as i64)
            }
        );
        assert_eq!(store.first_seen(b"a").unwrap(), Some(5));
    }

    #[test]
    fn ids_older_than_the_retention_expire_as_stream_time_moves() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let hour = HOUR.as_millis() as i64;
        for i in 0..100i64 {
            let mut staged = Staged::default();
            staged.put(format!("id-{i}").as_bytes(), i * hour / 10);
            store.apply(&staged).unwrap();
        }
        // Stream time is 9.9 h: ids first seen before 8.9 h are gone.
        assert_eq!(store.first_seen(b"id-0").unwrap(), None);
        assert_eq!(store.first_seen(b"id-88").unwrap(), None);
        assert_eq!(store.first_seen(b"id-90").unwrap(), Some(9 * hour));
        assert_eq!(store.id_count().unwrap(), 11, "ids 89..=99 remain");
    }

    #[test]
    fn an_id_seen_again_later_is_not_expired_by_its_old_entry() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let hour = HOUR.as_millis() as i64;
        let mut staged = Staged::default();
        staged.put(b"x", 0);
        store.apply(&staged).unwrap();
        let mut staged = Staged::default();
        staged.put(b"x", 2 * hour); // seen again after its window: a new first-seen time
        store.apply(&staged).unwrap();
        assert_eq!(store.first_seen(b"x").unwrap(), Some(2 * hour));
    }

    #[test]
    fn the_store_does_not_depend_on_how_writes_were_batched() {
        let hour = HOUR.as_millis() as i64;
        // id, time: late records, repeats with older times, a jump in stream time.
        let writes: Vec<(String, i64)> = (0..300)
            .map(|i| {
                (
                    format!("id-{}", i % 97),
                    (i * 7919 % 300) as i64 * hour / 50,
                )
            })
            .collect();
        let mut results = Vec::new();
        for chunk in [1, 7, 300] {
            let dir = tempfile::tempdir().unwrap();
            let mut store = open(dir.path());
            for part in writes.chunks(chunk) {
                let mut staged = Staged::default();
                for (id, t) in part {
                    staged.put(id.as_bytes(), *t);
                }
                store.apply(&staged).unwrap();
            }
            let state: Vec<_> = (0..97)
                .map(|i| store.first_seen(format!("id-{i}").as_bytes()).unwrap())
                .collect();
            results.push((state, store.id_count().unwrap()));
        }
        assert_eq!(results[0], results[1]);
        assert_eq!(results[1], results[2]);
    }

    #[test]
    fn time_keys_sort_by_time_including_negative_times() {
        let mut keys = [time_key(5, b"a"), time_key(-5, b"a"), time_key(0, b"a")];
        keys.sort();
        let times: Vec<_> = keys.iter().map(|k| parse_time_key(k).unwrap().0).collect();
        assert_eq!(times, [-5, 0, 5]);
    }
}
