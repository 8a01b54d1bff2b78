//! How committed writes reach RocksDB: one atomic batch per apply (the data, the offsets it
//! reflects and a bounded chunk of expiry), written either on the caller's thread or on a
//! thread of its own while the engine goes on processing ([`Applying`]).
//!
//! A background apply is the "committed, not yet written" layer: the store answers lookups
//! from it until the batch is written, so the next transaction decides against exactly what
//! the store will hold. Nothing but a committed transaction ever gets here; a crash before the
//! batch is written leaves the store at the previous batch's changelog offset, and the
//! changelog replay on the next start catches it up, as after any crash.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use rocksdb::{DB, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use super::{
    EXPIRY_CHUNK, Existing, ID_PREFIX, META_CHANGELOG_OFFSET, META_EXPIRED_THROUGH,
    META_INPUT_OFFSET, META_STREAM_TIME, Result, Staged, StoreError, StoreMeta, Window, id_key,
    parse_time_key, time_key,
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
    /// The read options of every lookup, made once.
    pub(super) lookup: Arc<ReadOptions>,
}

/// Ids up to this long are looked up without allocating their key.
const STACK_KEY: usize = 126;

/// What one apply will write, decided before it is written: the metadata it moves to (all
/// but how far expiry gets) and the cutoff below which ids are outside the window.
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

    /// First-seen time of `id` as written in RocksDB. The lookup of every record: the key is
    /// built on the stack (ids up to [`STACK_KEY`] bytes) and the value read in place.
    pub(super) fn first_seen(&self, id: &[u8]) -> Result<Option<i64>> {
        let mut buf = [0u8; STACK_KEY + ID_PREFIX.len()];
        let len = ID_PREFIX.len() + id.len();
        if len > buf.len() {
            return self.get_i64(&id_key(id));
        }
        buf[..ID_PREFIX.len()].copy_from_slice(ID_PREFIX);
        buf[ID_PREFIX.len()..len].copy_from_slice(id);
        self.get_i64(&buf[..len])
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
        let Plan { mut meta, cutoff } = plan;
        let mut batch = WriteBatch::default();
        // Expiry first: a put of this batch for an expiring id must win over its delete.
        if let Some(cutoff) = cutoff
            && meta.expired_through.is_none_or(|e| e < cutoff)
        {
            meta.expired_through =
                Some(self.expire_into(&mut batch, meta.expired_through, cutoff)?);
        }
        // Forgotten ids (changelog tombstones) go before the puts: an id put again after its
        // tombstone is in both, and its put must win.
        for id in &staged.forgets {
            batch.delete(id_key(id));
            // Its expiry index entry stays: expiry deletes an id only when the entry is still
            // its own, and drops the entry either way.
        }
        for (id, &time) in &staged.puts {
            if cutoff.is_some_and(|c| time < c) {
                continue; // already outside the window: expired on arrival
            }
            if existing == Existing::Check
                && !staged.forgets.contains(id)
                && self.first_seen(id)?.is_some_and(|existing| existing > time)
            {
                continue; // a later put of the same id wins, whatever the order
            }
            batch.put(id_key(id), time.to_be_bytes());
            batch.put(time_key(time, id), []);
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
        self.write(batch)?;
        Ok(meta)
    }

    /// Adds deletes for expiry index entries in `[from, cutoff)` and the ids they still own,
    /// at most [`EXPIRY_CHUNK`] of them. Returns how far expiry got: `cutoff` when it is done,
    /// otherwise the time of the first entry left (entries before it are gone).
    fn expire_into(&self, batch: &mut WriteBatch, from: Option<i64>, cutoff: i64) -> Result<i64> {
        let mut ro = ReadOptions::default();
        // Start after what was already expired: iterating over old tombstones gets slow.
        let lower = time_key(from.unwrap_or(i64::MIN), b"");
        ro.set_iterate_lower_bound(lower.clone());
        ro.set_iterate_upper_bound(time_key(cutoff, b""));
        let iter = self
            .db
            .iterator_opt(IteratorMode::From(&lower, rocksdb::Direction::Forward), ro);
        for (removed, item) in iter.enumerate() {
            let (key, _) = item.map_err(|e| StoreError::from_rocksdb(&self.path, e))?;
            let (time, id) = parse_time_key(&key)
                .ok_or_else(|| StoreError::damaged(&self.path, "malformed expiry index key"))?;
            if removed == EXPIRY_CHUNK {
                return Ok(time);
            }
            batch.delete(&key);
            // The id may have been seen again later (a newer entry): keep it then.
            if self.first_seen(id)? == Some(time) {
                batch.delete(id_key(id));
            }
        }
        Ok(cutoff)
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

    /// The time this batch writes for `id`, if it writes one.
    pub(super) fn first_seen(&self, id: &[u8]) -> Option<i64> {
        let time = *self.puts.puts.get(id)?;
        self.cutoff.is_none_or(|c| time >= c).then_some(time)
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
