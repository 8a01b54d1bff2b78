//! The dedup store of one task: a RocksDB database that only ever holds committed data.
//!
//! Writes of the open Kafka transaction are staged in memory ([`Staged`]) and reach RocksDB
//! only through [`TaskStore::apply`], which the engine calls after the transaction committed
//! (and restore calls with records read from the changelog under read_committed). `apply` writes
//! the data and the changelog offset it reflects in one atomic `WriteBatch`, so after any crash
//! the store is a consistent prefix of the changelog.
//!
//! Expiry reads and writes nothing per id: an id whose first sighting is older than the
//! window's cutoff (stream time − retention) is no longer answered by a lookup, and a
//! compaction filter drops it when RocksDB rewrites its file (as Kafka Streams drops a whole
//! window segment). The filter's cutoff is the one of the last batch written, so it never
//! drops an id a lookup could still answer.
//!
//! The store knows which changelog it is a prefix of (topic and partition, written when it is
//! created): opened for another one, it reports itself damaged instead of being mixed with a
//! log it never saw.
//!
//! Layout (one column family, so one batch is atomic without atomic_flush), format 2:
//! - `i/<id>`   → the id's first sighting: record time and source ([`Sighting`])
//! - `m/<name>` → metadata: format, changelog topic, partition and topic id, changelog offset,
//!   input offset, stream time, retention
//!
//! Format 1 also kept an expiry index (`t/<time><id>`) and how far expiry had got
//! (`m/expired_through`), and no sources. Opening such a store migrates it in one batch: the
//! index and that key are deleted, the format becomes 2, and its ids keep their times with
//! the source unknown.

mod apply;
mod fault;
mod ingest;
mod open_stores;
mod options;
mod sighting;
mod verify;

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rocksdb::{DB, IteratorMode, Options, ReadOptions, WriteBatch};
use streamapp_api::config::ResolvedRocksDb;

use apply::{Applying, Database};
pub use fault::{Fault, Result, StoreError, classify_io, classify_rocksdb};
pub use ingest::{BulkLoad, Run};
pub use open_stores::{Held, OpenStores};
pub use options::{MemoryRole, SharedMemory, rocksdb_options};
pub use sighting::{MAX_ENCODED, Sighting, Source};
pub use verify::{Verifier, VerifyOutcome};

const META_CHANGELOG_OFFSET: &[u8] = b"m/changelog_offset";
const META_CHANGELOG_TOPIC: &[u8] = b"m/changelog_topic";
const META_CHANGELOG_PARTITION: &[u8] = b"m/changelog_partition";
const META_CHANGELOG_TOPIC_ID: &[u8] = b"m/changelog_topic_id";
const META_INPUT_OFFSET: &[u8] = b"m/input_offset";
const META_STREAM_TIME: &[u8] = b"m/stream_time";
const META_RETENTION: &[u8] = b"m/retention_ms";
const META_FORMAT: &[u8] = b"m/format";
const FORMAT_VERSION: &[u8] = b"2";
const ID_PREFIX: &[u8] = b"i/";
/// Format 1's expiry index (`t/<time><id>`) and its progress, deleted by the migration.
const FORMAT_1_INDEX: (&[u8], &[u8]) = (b"t/", b"t0"); // '0' sorts right after '/'
const FORMAT_1_EXPIRED_THROUGH: &[u8] = b"m/expired_through";
/// The compaction filter's name (RocksDB records it in the options file).
const EXPIRY_FILTER: &str = "streamapp-expiry";

/// The changelog partition a store is a prefix of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangelogIdentity {
    pub topic: String,
    pub partition: i32,
    /// The topic's id (KIP-516), when known: a topic deleted and created again under the same
    /// name gets another one, so a store of the old one is not taken for a prefix of the new.
    pub topic_id: Option<[u8; 16]>,
}

/// How long ids are kept, and how far ahead of the wall clock record times may push the
/// store's stream time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub retention: Duration,
    pub max_skew: Duration,
}

impl Window {
    fn retention_ms(&self) -> i64 {
        self.retention.as_millis() as i64
    }
    fn max_skew_ms(&self) -> i64 {
        self.max_skew.as_millis() as i64
    }
    /// Ids first seen before this are outside the window at `stream_time`.
    fn cutoff(&self, stream_time: Option<i64>) -> Option<i64> {
        cutoff(stream_time, self.retention_ms())
    }
}

fn cutoff(stream_time: Option<i64>, retention_ms: i64) -> Option<i64> {
    stream_time.map(|t| t.saturating_sub(retention_ms))
}

/// Whether the compaction filter drops a key: an id whose sighting is older than `cutoff`.
/// Metadata, and anything it cannot read, stay.
fn expired(key: &[u8], value: &[u8], cutoff: i64) -> bool {
    key.starts_with(ID_PREFIX) && sighting::time_of(value).is_some_and(|t| t < cutoff)
}

/// The offsets and clocks a store reflects, stored in the same batches as its data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreMeta {
    /// Next changelog offset not yet applied.
    pub changelog_offset: Option<i64>,
    /// Next input offset, as of the last applied transaction.
    pub input_offset: Option<i64>,
    /// Largest record time applied (never beyond the wall clock plus the maximum skew).
    pub stream_time: Option<i64>,
}

/// What [`TaskStore::apply_at`] may assume about the ids it puts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Nothing: read each id, and keep a later time the store already holds.
    Check,
    /// Each put is newer than what the store holds for its id (if anything).
    Older,
}

/// Writes of one open transaction (or one restore chunk), not yet in RocksDB.
#[derive(Clone, Debug, Default)]
pub struct Staged {
    /// id → its first sighting.
    pub puts: BTreeMap<Vec<u8>, Sighting>,
    /// Ids to forget (a tombstone in the changelog). An id put after it was forgotten in the
    /// same batch is in both: the put wins and is not compared with what the store held.
    pub forgets: BTreeSet<Vec<u8>>,
    /// Changelog offset the store reflects once these are applied.
    pub changelog_offset: Option<i64>,
    /// Input offset the store reflects once these are applied.
    pub input_offset: Option<i64>,
    /// Largest record time among these.
    pub stream_time: Option<i64>,
}

impl Staged {
    /// Stages a sighting; an id put twice keeps its latest (as [`TaskStore::apply`] does),
    /// the first of two with the same time.
    pub fn put_sighting(&mut self, id: &[u8], sighting: Sighting) {
        self.observe_time(sighting.time);
        // One search: nearly every put is of an id the batch does not hold yet.
        match self.puts.entry(id.to_vec()) {
            Entry::Occupied(held) if !sighting.supersedes(held.get()) => {}
            Entry::Occupied(mut held) => *held.get_mut() = sighting,
            Entry::Vacant(slot) => {
                slot.insert(sighting);
            }
        }
    }

    /// Stages a sighting whose source is unknown.
    pub fn put(&mut self, id: &[u8], time: i64) {
        self.put_sighting(id, Sighting::at(time));
    }

    /// Stages forgetting `id`: the store drops what it holds for it, and what this batch put
    /// for it before (the changelog's order).
    pub fn forget(&mut self, id: &[u8]) {
        self.puts.remove(id);
        self.forgets.insert(id.to_vec());
    }

    /// Ids this batch puts or forgets.
    pub fn changes(&self) -> usize {
        self.puts.len() + self.forgets.len()
    }

    pub fn observe_time(&mut self, time: i64) {
        self.stream_time = Some(self.stream_time.map_or(time, |t| t.max(time)));
    }

    pub fn is_empty(&self) -> bool {
        self.puts.is_empty()
            && self.forgets.is_empty()
            && self.changelog_offset.is_none()
            && self.input_offset.is_none()
    }

    pub fn clear(&mut self) {
        *self = Staged::default();
    }
}

/// Tells each store opened by this process apart from the others (a verification result
/// belongs to the store it scanned, not to a successor at the same path).
static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

/// One task's store.
///
/// The database is shared with the background verifier ([`Verifier`]) only through a weak
/// handle it upgrades for one bounded chunk of keys at a time; dropping the store raises
/// `closing` and waits for such a chunk to end, so the database is closed (and its lock
/// released) by the time the store is gone.
///
/// Committed writes the engine hands over with [`TaskStore::apply_decided`] are written on a
/// thread of their own while the next transaction is processed; lookups see them at once
/// (`apply.rs`), and every other use of the store waits for them first.
pub struct TaskStore {
    database: Database,
    closing: Arc<AtomicBool>,
    id: u64,
    wal_dir: PathBuf,
    /// Whose memtable budget its writes count against.
    role: MemoryRole,
    /// What the store reflects once a background apply is written.
    meta: StoreMeta,
    applying: Option<Applying>,
    /// Its place among the stores lookups read ([`OpenStores::register`]), if it has one.
    registration: Option<open_stores::Registration>,
}

impl TaskStore {
    /// Opens (or creates) the store at `path` for the changelog partition `changelog`, its
    /// memtables counted against `role`'s budget.
    /// RocksDB recovers its WAL with the configured recovery mode. Damage (and a store of
    /// another changelog) comes back as [`StoreError::Damaged`], anything that says nothing
    /// about the files as [`StoreError::Unavailable`].
    pub fn open(
        path: &Path,
        wal_dir: Option<&Path>,
        tuning: &ResolvedRocksDb,
        memory: &SharedMemory,
        role: MemoryRole,
        window: Window,
        changelog: &ChangelogIdentity,
    ) -> Result<Self> {
        std::fs::create_dir_all(path)
            .map_err(|e| StoreError::from_io(path, "cannot create the store directory", &e))?;
        if let Some(w) = wal_dir {
            std::fs::create_dir_all(w).map_err(|e| {
                StoreError::from_io(
                    path,
                    &format!("cannot create the WAL directory {}", w.display()),
                    &e,
                )
            })?;
        }
        // What the compaction filter drops below: the cutoff of the last batch written (none
        // until the store's stream time is read).
        let watermark = Arc::new(AtomicI64::new(i64::MIN));
        let mut opts = rocksdb_options(tuning, memory, role, wal_dir);
        let filter_watermark = watermark.clone();
        opts.set_compaction_filter(EXPIRY_FILTER, move |_level, key: &[u8], value: &[u8]| {
            if expired(key, value, filter_watermark.load(Ordering::Relaxed)) {
                rocksdb::compaction_filter::Decision::Remove
            } else {
                rocksdb::compaction_filter::Decision::Keep
            }
        });
        // Files no write overlaps for long are rewritten anyway, so their expired ids go too.
        opts.set_periodic_compaction_seconds(window.retention.as_secs().clamp(3_600, 30 * 86_400));
        let db = DB::open(&opts, path).map_err(|e| StoreError::from_rocksdb(path, e))?;
        ingest::remove_unfinished_run(path);
        let mut store = TaskStore {
            database: Database {
                db: Arc::new(db),
                path: path.to_path_buf(),
                window,
                sync_on_commit: tuning.wal_sync_on_commit,
                wal_enabled: tuning.wal_enabled,
                write_buffer_bytes: tuning.write_buffer_bytes as usize,
                memory: memory.clone(),
                options: Arc::new(opts),
                lookup: Arc::new(ReadOptions::default()),
                watermark,
            },
            closing: Arc::new(AtomicBool::new(false)),
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            wal_dir: wal_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(|| path.to_path_buf()),
            role,
            meta: StoreMeta::default(),
            applying: None,
            registration: None,
        };
        store.migrate()?;
        store.check_identity(changelog)?;
        let database = &store.database;
        store.meta = StoreMeta {
            changelog_offset: database.get_i64(META_CHANGELOG_OFFSET)?,
            input_offset: database.get_i64(META_INPUT_OFFSET)?,
            stream_time: database.get_i64(META_STREAM_TIME)?,
        };
        if database.get_i64(META_RETENTION)? != Some(window.retention_ms()) {
            store.put_meta(META_RETENTION, &window.retention_ms().to_be_bytes())?;
        }
        store
            .database
            .raise_watermark(window.cutoff(store.meta.stream_time));
        Ok(store)
    }

    /// Brings a store of an earlier format to the current one, in one batch (a crash leaves
    /// it as it was, and the next open migrates it again). A new store just gets the format.
    fn migrate(&mut self) -> Result<()> {
        let database = &self.database;
        match database.get_raw(META_FORMAT)?.as_deref() {
            Some(FORMAT_VERSION) => Ok(()),
            None if database.is_empty()? => self.put_meta(META_FORMAT, FORMAT_VERSION),
            // No format but data: a store older than format 1 (the same layout).
            None | Some(b"1") => {
                let mut batch = WriteBatch::default();
                batch.delete_range(FORMAT_1_INDEX.0, FORMAT_1_INDEX.1);
                batch.delete(FORMAT_1_EXPIRED_THROUGH);
                batch.put(META_FORMAT, FORMAT_VERSION);
                database.write(batch)?;
                // The index was about half the store: give its space back now.
                database
                    .db
                    .compact_range(Some(FORMAT_1_INDEX.0), Some(FORMAT_1_INDEX.1));
                Ok(())
            }
            Some(v) => Err(StoreError::damaged(
                &database.path,
                format!("unknown store format {:?}", String::from_utf8_lossy(v)),
            )),
        }
    }

    /// A store records the changelog partition it is a prefix of when it is created (stores
    /// of earlier versions adopt the one they are opened for), and the topic's id once it is
    /// known; opened for another, or for a topic of the same name created again since, it is
    /// damaged as far as this task is concerned.
    fn check_identity(&mut self, changelog: &ChangelogIdentity) -> Result<()> {
        let topic = self.database.get_raw(META_CHANGELOG_TOPIC)?;
        let partition = self.database.get_i64(META_CHANGELOG_PARTITION)?;
        match (topic, partition) {
            (Some(t), Some(p))
                if t == changelog.topic.as_bytes() && p == changelog.partition as i64 =>
            {
                self.check_topic_id(changelog)
            }
            (Some(t), Some(p)) => Err(StoreError::damaged(
                &self.database.path,
                format!(
                    "the store belongs to changelog {} partition {p}, not {} partition {}",
                    String::from_utf8_lossy(&t),
                    changelog.topic,
                    changelog.partition
                ),
            )),
            _ => {
                let mut batch = WriteBatch::default();
                batch.put(META_CHANGELOG_TOPIC, changelog.topic.as_bytes());
                batch.put(
                    META_CHANGELOG_PARTITION,
                    (changelog.partition as i64).to_be_bytes(),
                );
                if let Some(id) = changelog.topic_id {
                    batch.put(META_CHANGELOG_TOPIC_ID, id);
                }
                self.database.write(batch)
            }
        }
    }

    /// The changelog's incarnation: a store that recorded another topic id reflects a topic
    /// since deleted (whatever its offsets say: the new one may have grown past them). A
    /// store without one adopts the id it is opened with.
    fn check_topic_id(&mut self, changelog: &ChangelogIdentity) -> Result<()> {
        let Some(id) = changelog.topic_id else {
            return Ok(());
        };
        match self.database.get_raw(META_CHANGELOG_TOPIC_ID)? {
            Some(stored) if stored == id => Ok(()),
            Some(stored) => Err(StoreError::damaged(
                &self.database.path,
                format!(
                    "the store reflects changelog {} with topic id {}, but the topic now has id {}: \
                     the changelog was recreated, so the store is not a prefix of it",
                    changelog.topic,
                    hex_id(&stored),
                    hex_id(&id)
                ),
            )),
            None => self.put_meta(META_CHANGELOG_TOPIC_ID, &id),
        }
    }

    pub fn path(&self) -> &Path {
        &self.database.path
    }

    /// This open store among all the stores this process opened.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The offsets and clocks the store reflects (a background apply counts: lookups see it).
    pub fn meta(&self) -> &StoreMeta {
        &self.meta
    }

    /// First-seen time of `id`, if the store remembers it (an id first seen before the
    /// window's cutoff is not remembered, whether compaction has dropped it yet or not).
    pub fn first_seen(&self, id: &[u8]) -> Result<Option<i64>> {
        if let Some(applying) = &self.applying
            && let Some(sighting) = applying.sighting(id)
        {
            return Ok(Some(sighting.time));
        }
        let time = self.database.first_seen(id)?;
        Ok(time.filter(|&t| self.within_window(t)))
    }

    /// The sighting of `id` the store remembers, with its source when known. `input_topic`:
    /// the topic most sources name, shared instead of allocated again.
    pub fn sighting(&self, id: &[u8], input_topic: Option<&Arc<str>>) -> Result<Option<Sighting>> {
        if let Some(applying) = &self.applying
            && let Some(sighting) = applying.sighting(id)
        {
            return Ok(Some(sighting.clone()));
        }
        let sighting = self.database.sighting(id, input_topic)?;
        Ok(sighting.filter(|s| self.within_window(s.time)))
    }

    fn within_window(&self, time: i64) -> bool {
        self.database
            .window
            .cutoff(self.meta.stream_time)
            .is_none_or(|c| time >= c)
    }

    /// Applies committed writes, their offsets and the expiry they allow, atomically.
    ///
    /// The result does not depend on how writes are grouped into batches (a transaction while
    /// processing, a chunk while restoring): each id keeps the latest time it was put with,
    /// and no id older than the retention before the newest stream time is answered.
    pub fn apply(&mut self, staged: &Staged) -> Result<()> {
        self.apply_at(staged, crate::shared::now_ms(), Existing::Check)
    }

    /// [`TaskStore::apply`] of a committed transaction's writes, decided against this store
    /// (each put is of an id the store does not hold, or holds with an older time, so it is
    /// not read again), written on a thread of its own: the call returns at once, lookups
    /// see the writes, and the next use of the store other than a lookup waits for them.
    /// Returns the failure of the previous background apply, if it failed (its writes are
    /// then not in the store, and these are not started).
    pub fn apply_decided(&mut self, staged: Staged) -> Result<()> {
        self.settle()?;
        let plan = self
            .database
            .plan(&self.meta, &staged, crate::shared::now_ms());
        let planned = plan.meta.clone();
        let applying = Applying::start(&self.database, plan, staged, self.meta.clone())?;
        self.meta = planned;
        self.applying = Some(applying);
        Ok(())
    }

    /// [`TaskStore::apply`] with the wall clock given: stream time never moves beyond
    /// `now_ms` plus the window's maximum skew, whatever times the records carry.
    pub fn apply_at(&mut self, staged: &Staged, now_ms: i64, existing: Existing) -> Result<()> {
        self.settle()?;
        let plan = self.database.plan(&self.meta, staged, now_ms);
        self.meta = self.database.write_planned(plan, staged, existing)?;
        Ok(())
    }

    /// Waits for a background apply to be written; its failure, if it failed (the store is
    /// then as it was before it).
    pub fn settle(&mut self) -> Result<()> {
        let Some(applying) = self.applying.take() else {
            return Ok(());
        };
        let before = applying.before.clone();
        match applying.finish(&self.database) {
            Ok(meta) => {
                self.meta = meta;
                Ok(())
            }
            Err(e) => {
                self.meta = before;
                Err(e)
            }
        }
    }

    /// Flushes memtables to SST files and syncs the WAL (after a background apply is written).
    pub fn flush(&mut self) -> Result<()> {
        self.settle()?;
        let database = &self.database;
        if database.wal_enabled {
            database
                .db
                .flush_wal(true)
                .map_err(|e| StoreError::from_rocksdb(&database.path, e))?;
        }
        database
            .db
            .flush()
            .map_err(|e| StoreError::from_rocksdb(&database.path, e))
    }

    /// Flushes and closes the store: afterwards nothing writes to it, so a checkpoint written
    /// now is the truth about it. What a drain and the end of a suspension do.
    pub fn close(mut self) -> Result<()> {
        self.flush()?;
        drop(self); // closes the database (see Drop)
        Ok(())
    }

    /// Whose memtable budget the store's writes count against.
    pub fn memory_role(&self) -> MemoryRole {
        self.role
    }

    /// Ids the store remembers (exact count; scans the id range).
    pub fn id_count(&self) -> Result<u64> {
        let cutoff = self.database.window.cutoff(self.meta.stream_time);
        count_ids(&self.database.db, &self.database.path, cutoff)
    }

    /// Ids held on disk, remembered or past the window and not yet compacted away.
    pub fn held_ids(&self) -> Result<u64> {
        count_ids(&self.database.db, &self.database.path, None)
    }

    /// Compacts the whole store now (expired ids are dropped).
    pub fn compact(&mut self) -> Result<()> {
        self.settle()?;
        self.database.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }

    /// RocksDB's estimate of the number of keys (cheap).
    pub fn estimated_keys(&self) -> u64 {
        self.database
            .db
            .property_int_value("rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Bytes of live SST files.
    pub fn sst_bytes(&self) -> u64 {
        self.database
            .db
            .property_int_value("rocksdb.live-sst-files-size")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// The directory holding this store's WAL files.
    pub fn wal_dir(&self) -> &Path {
        &self.wal_dir
    }

    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.put(key, value);
        self.database.write(batch)
    }
}

impl Drop for TaskStore {
    fn drop(&mut self) {
        // A batch being written finishes first (a failure changes nothing now: the changelog
        // holds its records, the next open replays them).
        let _ = self.settle();
        self.closing.store(true, Ordering::SeqCst);
        // The verifier holds the database for one chunk at most (milliseconds); it sees
        // `closing` before it takes the next one.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Arc::strong_count(&self.database.db) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn hex_id(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Ids whose sighting is not older than `cutoff` (all of them without one).
fn count_ids(db: &DB, path: &Path, cutoff: Option<i64>) -> Result<u64> {
    let mut ro = ReadOptions::default();
    ro.set_iterate_upper_bound(b"i0".to_vec()); // '0' sorts right after '/'
    ro.fill_cache(false);
    let mut n = 0;
    for item in db.iterator_opt(
        IteratorMode::From(ID_PREFIX, rocksdb::Direction::Forward),
        ro,
    ) {
        let (key, value) = item.map_err(|e| StoreError::from_rocksdb(path, e))?;
        let expired = cutoff.is_some_and(|c| expired(&key, &value, c));
        n += u64::from(!expired);
    }
    Ok(n)
}

fn id_key(id: &[u8]) -> Vec<u8> {
    [ID_PREFIX, id].concat()
}

/// What `inspect` reports of a store.
#[derive(Clone, Debug)]
pub struct StoreSummary {
    pub meta: StoreMeta,
    /// The changelog partition the store is a prefix of (stores of earlier versions: none).
    pub changelog: Option<(String, i64)>,
    /// Ids the store remembers (exact: the id range is scanned; a store that does not record
    /// its retention counts every id it holds).
    pub ids: u64,
    pub estimated_keys: u64,
    pub sst_bytes: u64,
}

/// Opens a store read-only: RocksDB replays its WAL in memory, takes no lock and changes no
/// file, so this works beside a running processor and before the store is opened for use.
fn open_db_read_only(path: &Path, wal_dir: Option<&Path>) -> Result<DB> {
    let mut opts = Options::default();
    if let Some(w) = wal_dir {
        opts.set_wal_dir(w);
    }
    DB::open_for_read_only(&opts, path, false).map_err(|e| StoreError::from_rocksdb(path, e))
}

/// The offsets a store vouches for and the changelog partition it is a prefix of (stores of
/// earlier versions: none).
/// A metadata value of a store opened read-only (`None` when missing or unreadable).
fn read_i64(db: &DB, key: &[u8]) -> Option<i64> {
    db.get(key)
        .ok()
        .flatten()
        .and_then(|v| v.as_slice().try_into().ok())
        .map(i64::from_be_bytes)
}

fn read_meta(db: &DB) -> (StoreMeta, Option<(String, i64)>) {
    let get = |key: &[u8]| read_i64(db, key);
    let meta = StoreMeta {
        changelog_offset: get(META_CHANGELOG_OFFSET),
        input_offset: get(META_INPUT_OFFSET),
        stream_time: get(META_STREAM_TIME),
    };
    let changelog_topic = db.get(META_CHANGELOG_TOPIC).ok().flatten();
    let changelog = changelog_topic
        .zip(get(META_CHANGELOG_PARTITION))
        .map(|(t, p)| (String::from_utf8_lossy(&t).into_owned(), p));
    (meta, changelog)
}

/// The changelog offset a store left on disk vouches for (its offsets are written in the same
/// batches as its data, so this holds after an unclean stop too), if it is a store of
/// `changelog`: what a pod tells its group about such a store before it opens it.
pub fn changelog_offset_on_disk(
    path: &Path,
    wal_dir: Option<&Path>,
    changelog: &ChangelogIdentity,
) -> Result<Option<i64>> {
    let db = open_db_read_only(path, wal_dir)?;
    let (meta, of) = read_meta(&db);
    let stored_id = db.get(META_CHANGELOG_TOPIC_ID).ok().flatten();
    let another_incarnation = changelog
        .topic_id
        .zip(stored_id)
        .is_some_and(|(id, stored)| stored != id);
    Ok(match of {
        Some((topic, partition))
            if topic != changelog.topic || partition != i64::from(changelog.partition) =>
        {
            None
        }
        _ if another_incarnation => None,
        _ => meta.changelog_offset,
    })
}

/// Summarises a store read-only (for `inspect`, beside a running processor).
pub fn open_read_only(path: &Path, wal_dir: Option<&Path>) -> Result<StoreSummary> {
    let db = open_db_read_only(path, wal_dir)?;
    let (meta, changelog) = read_meta(&db);
    let cutoff = read_i64(&db, META_RETENTION).and_then(|r| cutoff(meta.stream_time, r));
    Ok(StoreSummary {
        ids: count_ids(&db, path, cutoff)?,
        meta,
        changelog,
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
pub(crate) mod tests;
