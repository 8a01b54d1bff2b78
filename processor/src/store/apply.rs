//! How committed writes reach RocksDB: one atomic batch per apply (the data and the offsets it
//! reflects), written either on the caller's thread or on a thread of its own while the engine
//! goes on processing ([`Applying`]).
//!
//! A background apply is the "committed, not yet written" layer: the store answers lookups
//! from it until the batch is written, so the next transaction decides against exactly what
//! the store will hold. Nothing but a committed transaction ever gets here; a crash before the
//! batch is written leaves the store at the previous batch's changelog offset, and the
//! changelog replay on the next start catches it up, as after any crash.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::thread::JoinHandle;

use rocksdb::{DB, DBPinnableSlice, Options, ReadOptions, WriteBatch, WriteOptions};

use super::options::SharedMemory;
use super::sighting::{self, MAX_ENCODED, Sighting};
use super::{
    Existing, ID_PREFIX, META_CHANGELOG_OFFSET, META_INPUT_OFFSET, META_STREAM_TIME, Result,
    Staged, StoreError, StoreMeta, Window, id_key,
};

/// A store's RocksDB database and how it writes: what a background apply needs to take
/// along (cheap to clone: the database is shared).
#[derive(Clone)]
pub(super) struct Database {
    pub(super) db: Arc<DB>,
    pub(super) path: PathBuf,
    pub(super) window: Window,
    /// fsync the WAL with each batch (`rocksdb.walSyncOnCommit`).
    pub(super) sync_on_commit: bool,
    pub(super) wal_enabled: bool,
    /// One memtable's size (`rocksdb.writeBufferBytes`), and the memory every store shares: a
    /// restore's runs take the memtables' place, within their budget (`ingest.rs`).
    pub(super) write_buffer_bytes: usize,
    pub(super) memory: SharedMemory,
    /// The options it was opened with: a restore's runs are written with its table options.
    pub(super) options: Arc<Options>,
    /// The read options of every lookup, made once.
    pub(super) lookup: Arc<ReadOptions>,
    /// The cutoff of the last batch written: the compaction filter drops ids older than it.
    pub(super) watermark: Arc<AtomicI64>,
}

/// Ids up to this long are looked up and written without allocating their key.
const STACK_KEY: usize = 126;

/// Calls `f` with the store key of `id`, built on the stack (ids up to [`STACK_KEY`] bytes):
/// the key of every record's lookup and of every put.
pub(super) fn with_id_key<R>(id: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    let mut buf = [0u8; STACK_KEY + ID_PREFIX.len()];
    let len = ID_PREFIX.len() + id.len();
    if len > buf.len() {
        return f(&id_key(id));
    }
    buf[..ID_PREFIX.len()].copy_from_slice(ID_PREFIX);
    buf[ID_PREFIX.len()..len].copy_from_slice(id);
    f(&buf[..len])
}

/// What one apply will write, decided before it is written: the metadata it moves to and the
/// cutoff below which ids are outside the window.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) meta: StoreMeta,
    pub(super) cutoff: Option<i64>,
}

impl Database {
    pub(super) fn write(&self, batch: WriteBatch) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(self.wal_enabled && self.sync_on_commit);
        wo.disable_wal(!self.wal_enabled);
        self.db
            .write_opt(batch, &wo)
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))
    }

    pub(super) fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get(key)
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))
    }

    pub(super) fn get_i64(&self, key: &[u8]) -> Result<Option<i64>> {
        let value = self
            .db
            .get_pinned_opt(key, &self.lookup)
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
        let Some(value) = value else {
            return Ok(None);
        };
        let bytes: [u8; 8] = value.as_ref().try_into().map_err(|_| {
            StoreError::damaged(
                &self.path,
                format!(
                    "value of {} is {} bytes, expected 8",
                    String::from_utf8_lossy(key),
                    value.len()
                ),
            )
        })?;
        Ok(Some(i64::from_be_bytes(bytes)))
    }

    /// Whether the store holds no key at all (a new store).
    pub(super) fn is_empty(&self) -> Result<bool> {
        match self.db.iterator(rocksdb::IteratorMode::Start).next() {
            None => Ok(true),
            Some(Ok(_)) => Ok(false),
            Some(Err(e)) => Err(StoreError::from_rocksdb(&self.path, e)),
        }
    }

    /// Moves the compaction filter's cutoff up to `cutoff` (never down).
    pub(super) fn raise_watermark(&self, cutoff: Option<i64>) {
        if let Some(c) = cutoff {
            self.watermark.fetch_max(c, Ordering::Relaxed);
        }
    }

    /// The stored value of `id`, read in place: the lookup of every record.
    fn get_id(&self, id: &[u8]) -> Result<Option<DBPinnableSlice<'_>>> {
        with_id_key(id, |key| self.db.get_pinned_opt(key, &self.lookup))
            .map_err(|e| StoreError::from_rocksdb(&self.path, e))
    }

    fn unreadable(&self, id: &[u8]) -> StoreError {
        StoreError::damaged(
            &self.path,
            format!(
                "the value of id {} is not a sighting",
                String::from_utf8_lossy(id)
            ),
        )
    }

    /// First-seen time of `id` as written in RocksDB (expired or not).
    pub(super) fn first_seen(&self, id: &[u8]) -> Result<Option<i64>> {
        let Some(value) = self.get_id(id)? else {
            return Ok(None);
        };
        sighting::time_of(&value)
            .map(Some)
            .ok_or_else(|| self.unreadable(id))
    }

    /// First-seen times of `ids` as written in RocksDB, expired or not: one MultiGet, which
    /// looks the keys up together instead of one lookup each (a restore checks every id of
    /// each chunk it applies).
    fn first_seen_all(&self, ids: &[&[u8]]) -> Result<Vec<Option<i64>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let values = self
            .db
            .multi_get_opt(ids.iter().map(|id| id_key(id)), &self.lookup);
        ids.iter()
            .zip(values)
            .map(|(id, value)| {
                let value = value.map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
                value
                    .map(|v| sighting::time_of(&v).ok_or_else(|| self.unreadable(id)))
                    .transpose()
            })
            .collect()
    }

    /// The sighting of `id` as written in RocksDB (expired or not).
    pub(super) fn sighting(
        &self,
        id: &[u8],
        input_topic: Option<&Arc<str>>,
    ) -> Result<Option<Sighting>> {
        let Some(value) = self.get_id(id)? else {
            return Ok(None);
        };
        Sighting::decode(&value, input_topic)
            .map(Some)
            .ok_or_else(|| self.unreadable(id))
    }

    /// The metadata `staged` moves the store from `meta` to, and the window's cutoff after
    /// it. Stream time never moves beyond `now_ms` plus the window's maximum skew.
    pub(super) fn plan(&self, meta: &StoreMeta, staged: &Staged, now_ms: i64) -> Plan {
        let mut meta = meta.clone();
        if let Some(t) = staged.stream_time {
            let bounded = t.min(now_ms.saturating_add(self.window.max_skew_ms()));
            meta.stream_time = Some(meta.stream_time.map_or(bounded, |s| s.max(bounded)));
        }
        if let Some(o) = staged.changelog_offset {
            meta.changelog_offset = Some(o);
        }
        if let Some(o) = staged.input_offset {
            meta.input_offset = Some(o);
        }
        let cutoff = meta
            .stream_time
            .map(|t| t.saturating_sub(self.window.retention_ms()));
        Plan { meta, cutoff }
    }

    /// Writes `staged` as `plan` says, in one batch; returns the metadata the store is at.
    pub(super) fn write_planned(
        &self,
        plan: Plan,
        staged: &Staged,
        existing: Existing,
    ) -> Result<StoreMeta> {
        let Plan { meta, cutoff } = plan;
        let mut batch = WriteBatch::default();
        // Forgotten ids (changelog tombstones) go before the puts: an id put again after its
        // tombstone is in both, and its put must win.
        for id in &staged.forgets {
            with_id_key(id, |key| batch.delete(key));
        }
        let expired = |sighting: &Sighting| cutoff.is_some_and(|c| sighting.time < c);
        // The puts to compare with what the store holds, in key order: read together.
        let checked = |id: &[u8], sighting: &Sighting| {
            existing == Existing::Check && !expired(sighting) && !staged.forgets.contains(id)
        };
        let to_check: Vec<&[u8]> = match existing {
            Existing::Check => staged
                .puts
                .iter()
                .filter(|(id, sighting)| checked(id, sighting))
                .map(|(id, _)| id.as_slice())
                .collect(),
            Existing::Older => Vec::new(),
        };
        let mut held = self.first_seen_all(&to_check)?.into_iter();
        let mut value = [0u8; MAX_ENCODED];
        for (id, sighting) in &staged.puts {
            if expired(sighting) {
                continue; // already outside the window: expired on arrival
            }
            if checked(id, sighting)
                && held
                    .next()
                    .expect("a time read for each checked put")
                    .is_some_and(|existing| existing > sighting.time)
            {
                continue; // a later put of the same id wins, whatever the order
            }
            let len = sighting.encode(&mut value);
            with_id_key(id, |key| batch.put(key, &value[..len]));
        }
        put_meta(&mut batch, &meta);
        self.write(batch)?;
        // Only now may compaction drop what this batch's cutoff leaves behind: a crash before
        // the write would reopen the store at the previous stream time, whose window still
        // holds those ids.
        self.raise_watermark(cutoff);
        Ok(meta)
    }

    /// Writes the offsets and clocks of a plan whose data is in the store already (a
    /// restore's ingested run), in one batch; the metadata the store is at.
    pub(super) fn write_meta(&self, meta: StoreMeta, cutoff: Option<i64>) -> Result<StoreMeta> {
        let mut batch = WriteBatch::default();
        put_meta(&mut batch, &meta);
        self.write(batch)?;
        self.raise_watermark(cutoff);
        Ok(meta)
    }
}

/// The offsets and clocks a batch moves the store to.
pub(super) fn put_meta(batch: &mut WriteBatch, meta: &StoreMeta) {
    for (key, value) in [
        (META_CHANGELOG_OFFSET, meta.changelog_offset),
        (META_INPUT_OFFSET, meta.input_offset),
        (META_STREAM_TIME, meta.stream_time),
    ] {
        if let Some(v) = value {
            batch.put(key, v.to_be_bytes());
        }
    }
}

/// A committed batch being written on a thread of its own.
pub(super) struct Applying {
    /// The ids it puts that are inside the window (the ones it writes), with their times.
    puts: Arc<Staged>,
    cutoff: Option<i64>,
    /// The store's metadata before it, for when it fails.
    pub(super) before: StoreMeta,
    thread: JoinHandle<Result<StoreMeta>>,
}

impl Applying {
    /// Starts writing `staged` (puts decided against the store: each newer than what it
    /// holds) as `plan` says.
    pub(super) fn start(
        database: &Database,
        plan: Plan,
        staged: Staged,
        before: StoreMeta,
    ) -> Result<Self> {
        let puts = Arc::new(staged);
        let cutoff = plan.cutoff;
        let (database, staged) = (database.clone(), puts.clone());
        let path = database.path.clone();
        let thread = std::thread::Builder::new()
            .name("store-apply".into())
            .spawn(move || database.write_planned(plan, &staged, Existing::Older))
            .map_err(|e| StoreError::from_io(&path, "starting the thread that applies", &e))?;
        Ok(Applying {
            puts,
            cutoff,
            before,
            thread,
        })
    }

    /// The sighting this batch writes for `id`, if it writes one.
    pub(super) fn sighting(&self, id: &[u8]) -> Option<&Sighting> {
        let sighting = self.puts.puts.get(id)?;
        self.cutoff
            .is_none_or(|c| sighting.time >= c)
            .then_some(sighting)
    }

    /// Waits until the batch is written; the metadata the store is at then.
    pub(super) fn finish(self, database: &Database) -> Result<StoreMeta> {
        self.thread.join().unwrap_or_else(|_| {
            Err(StoreError::from_io(
                &database.path,
                "applying committed writes",
                &std::io::Error::other("the thread that applies them panicked"),
            ))
        })
    }
}
