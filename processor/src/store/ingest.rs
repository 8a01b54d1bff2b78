//! Restoring an empty store past RocksDB's write path: the changelog read in sorted runs, each
//! written as an SST file and ingested (moved into the store), so no record goes through the
//! memtable, the WAL or a flush. What a bulk load does; a store that held nothing when its
//! restore began (a lost disk, a pod on a new node, a task new to this pod) is restored so.
//!
//! A run gives the store exactly what [`TaskStore::apply`] of the same records would, only
//! written another way:
//! - within a run, each id's records are taken together as [`Staged`] takes them (the later
//!   time wins, a forget drops the puts before it and makes the next put win outright);
//! - across runs, an id put by an earlier run keeps the later of the two times. Ingested files
//!   shadow older ones whatever their values, so a put is compared with what the store holds,
//!   as `apply` compares every put, but only when an earlier run put the same id: the load
//!   keeps the 64-bit hashes of the ids its runs put (8 bytes per id, sorted), and a run's
//!   hashes are merged against them in one pass. Nearly every id of a changelog is put once,
//!   so nearly no put is read; a hash that two ids share costs one needless read, never a
//!   wrong answer.
//!
//! The changelog offset and the clocks a run reflects are written after its file is ingested,
//! in one batch. A crash between the two leaves the data of the run in the store and the offset
//! before it: the next start finds the store not empty, replays the run through `apply`, and
//! that changes nothing (an id keeps the later time, a forget forgets again).
//!
//! Compaction: every run holds ids from the whole key space, so each file ingested overlaps all
//! the others and goes into level 0. With RocksDB's trigger of 4 files, it merged them into the
//! level below again and again while the load lasted, each time rewriting all that was loaded
//! so far: 40% of the core's time in the second half of a pinned 5M-id restore
//! (docs/performance.md). While a load lasts, its store lets up to
//! [`BULK_LOAD_L0_COMPACTION_TRIGGER`] files gather (below the count at which RocksDB slows
//! writes), and when it ends, however it ends, the usual trigger comes back and RocksDB merges
//! what gathered in the background, once, with the store in service (about as much CPU as the
//! merges during the load took, measured: the merge is moved, not saved). Until it is done, a
//! lookup checks each level-0 file's filter.
//!
//! Memory: a run takes the place of a memtable, so it is as large as one, and it is held out
//! of the role's memtable budget for as long as the load lasts ([`SharedMemory::reserve`](super::SharedMemory::reserve)):
//! memtables and runs together stay within the budget the operator sizes the pod by. When the
//! budget has no memtable's worth left (other loads hold it), the store is restored the usual
//! way.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::path::{Path, PathBuf};
use std::sync::Weak;

use rocksdb::{DB, IngestExternalFileOptions, SstFileWriter};
use tracing::warn;

use super::apply::{Plan, with_id_key};
use super::options::{L0_COMPACTION_TRIGGER, L0_SLOWDOWN_WRITES_TRIGGER, Reservation};
use super::sighting::{MAX_ENCODED, Sighting};
use super::{ID_PREFIX, Result, Staged, StoreError, TaskStore};

/// Where a run is written before it is ingested. One run at a time per store, so one name; a
/// file a crash left behind is removed when the store is opened again.
const RUN_FILE: &str = "restore-run.sst";

/// Removes a run's file that a crash left in the store's directory (RocksDB never looks at it).
pub(super) fn remove_unfinished_run(store: &Path) {
    let _ = std::fs::remove_file(store.join(RUN_FILE));
}

/// What a run holds in memory per record, about: the record and its id as read (48 bytes and
/// the id's), and while it is written, its entry in the sort (24), in the sorted ids (32) and
/// its id's hash (24).
pub(super) const RUN_BYTES_PER_RECORD: usize = 144;

/// The least part of the memtable budget worth a bulk load: smaller runs would make many
/// small files for compaction to merge.
const MIN_RUN_BYTES: u64 = 1 << 20;

/// Level-0 files a bulk load's store lets gather before it compacts them (see the module's
/// doc): a load of up to this many runs is merged once, after it.
const BULK_LOAD_L0_COMPACTION_TRIGGER: i32 = 16;
const _: () = assert!(BULK_LOAD_L0_COMPACTION_TRIGGER < L0_SLOWDOWN_WRITES_TRIGGER);

/// The bulk load of one empty store: which ids its runs have put so far.
#[derive(Debug)]
pub struct BulkLoad {
    /// Hashes of the ids put by the runs ingested so far, sorted (duplicates allowed).
    put: Vec<u64>,
    /// The part of the memtable budget its runs hold, for as long as it lasts.
    memory: Reservation,
    /// The store's compaction, held back for as long as it lasts.
    _compaction: DeferredCompaction,
}

/// A store's level-0 compaction trigger raised to [`BULK_LOAD_L0_COMPACTION_TRIGGER`]; the
/// usual one is set again when dropped. (Only the open database's: a store opened again after
/// a crash mid-load has the usual trigger from its options.)
#[derive(Debug)]
struct DeferredCompaction {
    /// Not kept open by the load: a store closed meanwhile has nothing to give back.
    db: Weak<DB>,
    path: PathBuf,
}

impl DeferredCompaction {
    fn new(database: &super::Database) -> Result<Self> {
        set_l0_compaction_trigger(&database.db, BULK_LOAD_L0_COMPACTION_TRIGGER)
            .map_err(|e| StoreError::from_rocksdb(&database.path, e))?;
        Ok(DeferredCompaction {
            db: std::sync::Arc::downgrade(&database.db),
            path: database.path.clone(),
        })
    }
}

impl Drop for DeferredCompaction {
    fn drop(&mut self) {
        let Some(db) = self.db.upgrade() else { return };
        if let Err(error) = set_l0_compaction_trigger(&db, L0_COMPACTION_TRIGGER) {
            // The store works, its level 0 only grows up to the raised trigger before it is
            // compacted, until it is opened again.
            warn!(store = %self.path.display(), %error,
                "could not give a bulk-loaded store its usual compaction trigger back");
        }
    }
}

fn set_l0_compaction_trigger(db: &DB, files: i32) -> Result<(), rocksdb::Error> {
    db.set_options(&[(
        "level0_file_num_compaction_trigger",
        files.to_string().as_str(),
    )])
}

/// The same hash for the same id, for as long as the process runs (a load lives in one).
fn id_hash(id: &[u8]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(id)
}

impl BulkLoad {
    /// Records per run: a run takes the place of a memtable, in memory as on disk (one file
    /// per run, as one per flush), and is as large as the part of the budget the load holds
    /// (one memtable's, unless less was left).
    pub fn run_records(&self) -> usize {
        (self.memory.bytes() as usize / RUN_BYTES_PER_RECORD).max(1)
    }

    /// Which of `hashes` (sorted) an earlier run put, found in one pass over both; then adds
    /// them to the load's.
    fn meet(&mut self, hashes: &[u64]) -> Vec<u64> {
        let mut met = Vec::new();
        let mut merged = Vec::with_capacity(self.put.len() + hashes.len());
        let (mut a, mut b) = (self.put.iter().peekable(), hashes.iter().peekable());
        while let (Some(&&x), Some(&&y)) = (a.peek(), b.peek()) {
            if x == y {
                met.push(y);
            }
            if x <= y {
                merged.push(x);
                a.next();
            } else {
                merged.push(y);
                b.next();
            }
        }
        merged.extend(a);
        merged.extend(b);
        self.put = merged;
        met
    }
}

/// A bulk load's run being filled: the changelog's records as they were read, put in key order
/// once, when the run is written. (Kept in order record by record, in [`Staged`]'s ordered map,
/// the run took a fifth of a full restore's time.)
#[derive(Debug, Default)]
pub struct Run {
    /// The records' ids, one after another.
    ids: Vec<u8>,
    /// Per record, in changelog order: where its id ends in `ids`, and its sighting (none: a
    /// tombstone, which forgets the id).
    records: Vec<(usize, Option<Sighting>)>,
    /// Changelog offset the store reflects once the run is written.
    pub changelog_offset: Option<i64>,
    /// Largest record time among the run's sightings.
    stream_time: Option<i64>,
}

/// What a run does to one id, all its records taken together (as [`Staged`] takes them).
struct Change<'r> {
    /// The sighting the run keeps for it, if any: of the puts after its last forget, the one
    /// [`Sighting::supersedes`] the others.
    put: Option<&'r Sighting>,
    /// Whether the run forgets it first: then its put, if any, wins whatever the store holds.
    forgotten: bool,
}

impl Run {
    pub fn put_sighting(&mut self, id: &[u8], sighting: Sighting) {
        self.stream_time = Some(
            self.stream_time
                .map_or(sighting.time, |t| t.max(sighting.time)),
        );
        self.push(id, Some(sighting));
    }

    pub fn forget(&mut self, id: &[u8]) {
        self.push(id, None);
    }

    fn push(&mut self, id: &[u8], sighting: Option<Sighting>) {
        self.ids.extend_from_slice(id);
        self.records.push((self.ids.len(), sighting));
    }

    /// Records in the run.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.changelog_offset.is_none()
    }

    /// Empties the run for the next one, keeping its buffers.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.records.clear();
        self.changelog_offset = None;
        self.stream_time = None;
    }

    fn id(&self, record: usize) -> &[u8] {
        let start = record.checked_sub(1).map_or(0, |r| self.records[r].0);
        &self.ids[start..self.records[record].0]
    }

    /// Each id of the run once, in key order, with what the run does to it.
    fn changes(&self) -> Vec<(&[u8], Change<'_>)> {
        // Each record's id beside its place in the run, sorted by both: an id's records stay
        // in changelog order. (Sorting places alone and finding each id at every comparison
        // read the records' list at random, cache miss after cache miss.)
        let mut order: Vec<(&[u8], usize)> =
            (0..self.records.len()).map(|r| (self.id(r), r)).collect();
        order.sort_unstable();
        order
            .chunk_by(|a, b| a.0 == b.0)
            .map(|records| {
                let mut change = Change {
                    put: None,
                    forgotten: false,
                };
                for &(_, r) in records {
                    match &self.records[r].1 {
                        Some(s) if change.put.is_none_or(|held| s.supersedes(held)) => {
                            change.put = Some(s)
                        }
                        Some(_) => {}
                        None => {
                            change.put = None;
                            change.forgotten = true;
                        }
                    }
                }
                (records[0].0, change)
            })
            .collect()
    }
}

impl TaskStore {
    /// A bulk load, if the store holds nothing yet (no id, no changelog offset) and its
    /// role's memtable budget has room for its runs (one memtable's worth, at least
    /// [`MIN_RUN_BYTES`], always leaving one memtable's worth to the memtables). Otherwise
    /// its restore applies through [`TaskStore::apply`]. The store's compaction waits for the
    /// load to end (see the module's doc).
    pub fn bulk_load(&self) -> Result<Option<BulkLoad>> {
        if self.applying.is_some()
            || self.meta.changelog_offset.is_some()
            || self.database.holds_ids()?
        {
            return Ok(None);
        }
        let memtable = self.database.write_buffer_bytes as u64;
        let memory = self.database.memory.reserve(self.role, memtable, memtable);
        if memory.bytes() < MIN_RUN_BYTES {
            return Ok(None);
        }
        Ok(Some(BulkLoad {
            put: Vec::new(),
            memory,
            _compaction: DeferredCompaction::new(&self.database)?,
        }))
    }

    /// Applies one run of a bulk load: what [`TaskStore::apply`] of the same records would
    /// give, its data ingested as an SST file, then its offsets and clocks in one batch.
    pub fn apply_run(&mut self, run: &Run, load: &mut BulkLoad) -> Result<()> {
        self.settle()?;
        let clocks = Staged {
            changelog_offset: run.changelog_offset,
            stream_time: run.stream_time,
            ..Staged::default()
        };
        let Plan { meta, cutoff } =
            self.database
                .plan(&self.meta, &clocks, crate::shared::now_ms());
        let expired = |s: &Sighting| cutoff.is_some_and(|c| s.time < c);
        let changes = run.changes();
        // Each put's id hashed once: merged against the earlier runs', then looked up in `met`.
        let put_hashes: Vec<Option<u64>> = changes
            .iter()
            .map(|(id, c)| c.put.is_some_and(|s| !expired(s)).then(|| id_hash(id)))
            .collect();
        let mut hashes: Vec<u64> = put_hashes.iter().flatten().copied().collect();
        hashes.sort_unstable();
        let met = load.meet(&hashes);
        let file = self.database.path.join(RUN_FILE);
        let mut writer: Option<SstFileWriter> = None;
        let mut value = [0u8; MAX_ENCODED];
        for ((id, change), hash) in changes.into_iter().zip(put_hashes) {
            let entry = match change {
                // Forgotten, then put again: the put wins, whatever the store held.
                Change {
                    put: Some(s),
                    forgotten: true,
                } if !expired(s) => Some(s),
                Change {
                    forgotten: true, ..
                } => None,
                Change { put: None, .. } => continue, // not reached: a record puts or forgets
                Change { put: Some(s), .. } if expired(s) => continue, // outside the window on arrival
                Change { put: Some(s), .. } => {
                    let earlier = hash.is_some_and(|h| met.binary_search(&h).is_ok())
                        && self.database.first_seen(id)?.is_some_and(|t| t > s.time);
                    if earlier {
                        continue; // an earlier run put a later time: it stays
                    }
                    Some(s)
                }
            };
            let writer = match &mut writer {
                Some(w) => w,
                None => writer.insert(self.database.run_writer(&file)?),
            };
            with_id_key(id, |key| match entry {
                Some(s) => {
                    let len = s.encode(&mut value);
                    writer.put(key, &value[..len])
                }
                None => writer.delete(key),
            })
            .map_err(|e| StoreError::from_rocksdb(&file, e))?;
        }
        if let Some(mut writer) = writer {
            writer
                .finish()
                .map_err(|e| StoreError::from_rocksdb(&file, e))?;
            drop(writer);
            self.database.ingest(&file)?;
        }
        self.meta = self.database.write_meta(meta, cutoff)?;
        Ok(())
    }
}

impl super::Database {
    /// Whether the store holds any id (expired or not).
    fn holds_ids(&self) -> Result<bool> {
        let mut ids = self.db.prefix_iterator(ID_PREFIX);
        match ids.next() {
            None => Ok(false),
            Some(Ok((key, _))) => Ok(key.starts_with(ID_PREFIX)),
            Some(Err(e)) => Err(StoreError::from_rocksdb(&self.path, e)),
        }
    }

    /// A writer of a run's file, with the store's table options (its filters and blocks are
    /// the ones a flush would write).
    fn run_writer(&self, run: &Path) -> Result<SstFileWriter<'_>> {
        let writer = SstFileWriter::create(&self.options);
        writer
            .open(run)
            .map_err(|e| StoreError::from_rocksdb(run, e))?;
        Ok(writer)
    }

    /// Moves the run's file into the store. The file is gone afterwards, whether it went in
    /// or not.
    fn ingest(&self, run: &Path) -> Result<()> {
        let mut opts = IngestExternalFileOptions::default();
        opts.set_move_files(true);
        let ingested = self
            .db
            .ingest_external_file_opts(&opts, vec![run])
            .map_err(|e| StoreError::from_rocksdb(&self.path, e));
        if ingested.is_err() {
            let _ = std::fs::remove_file(run);
        }
        ingested
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryRole, SharedMemory};

    #[test]
    fn a_run_meets_the_ids_of_earlier_runs_and_joins_them() {
        let tuning = streamapp_api::config::ResolvedRocksDb::profile(
            streamapp_api::config::RocksDbProfile::LowMemory,
        );
        let memory = SharedMemory::new(&tuning, false).reserve(MemoryRole::Active, 1 << 20, 0);
        let mut load = BulkLoad {
            put: Vec::new(),
            memory,
            _compaction: DeferredCompaction {
                db: Weak::new(),
                path: PathBuf::new(),
            },
        };
        assert_eq!(load.meet(&[3, 5, 9]), Vec::<u64>::new());
        assert_eq!(load.meet(&[1, 5, 9, 12]), vec![5, 9]);
        assert_eq!(load.put, vec![1, 3, 5, 5, 9, 9, 12]);
        assert_eq!(load.meet(&[0, 12, 13]), vec![12]);
        assert_eq!(load.meet(&[]), Vec::<u64>::new());
    }

    fn int_property(store: &TaskStore, name: &str) -> u64 {
        store.database.db.property_int_value(name).unwrap().unwrap()
    }

    /// Waits (up to 30 s) until RocksDB has no compaction to run or running in the store.
    fn compactions_done(store: &TaskStore) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while int_property(store, "rocksdb.compaction-pending") > 0
            || int_property(store, "rocksdb.num-running-compactions") > 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "compaction did not end"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// A load's runs stay in level 0 while it lasts, more of them than the usual trigger, and
    /// are compacted once it ends.
    #[test]
    fn a_bulk_loads_runs_are_compacted_once_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            crate::store::tests::try_open(dir.path(), &crate::store::tests::changelog(0)).unwrap();
        let mut load = store.bulk_load().unwrap().expect("an empty store");
        let runs = L0_COMPACTION_TRIGGER as usize + 2;
        for r in 0..runs {
            // Each run's ids spread over the key space, as a changelog's are.
            let mut run = Run::default();
            for i in 0..100 {
                run.put_sighting(format!("id-{i:03}-{r}").as_bytes(), Sighting::at(1_000));
            }
            run.changelog_offset = Some(((r + 1) * 100) as i64);
            store.apply_run(&run, &mut load).unwrap();
        }
        compactions_done(&store);
        // The first run's file went to the last level: nothing was in its way.
        assert_eq!(
            int_property(&store, "rocksdb.num-files-at-level0"),
            runs as u64 - 1,
            "every later run still in level 0 while the load lasts"
        );
        drop(load);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while int_property(&store, "rocksdb.num-files-at-level0") >= L0_COMPACTION_TRIGGER as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "level 0 was not compacted after the load"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(store.first_seen(b"id-042-3").unwrap(), Some(1_000));
    }

    /// A run keeps for each id what a staged batch of the same records keeps.
    #[test]
    fn a_run_keeps_for_each_id_what_a_staged_batch_keeps() {
        let records: Vec<(&[u8], Option<i64>)> = vec![
            (b"b", Some(2)),
            (b"a", None),
            (b"c", None),
            (b"c", Some(3)),
            (b"d", Some(5)),
            (b"d", Some(4)),
            (b"d", None),
            (b"e", Some(7)),
            (b"e", Some(9)),
            (b"e", Some(8)),
            (b"f", Some(1)),
            (b"f", None),
            (b"f", Some(6)),
            (b"f", Some(2)),
        ];
        let (mut run, mut staged) = (Run::default(), Staged::default());
        for (id, time) in &records {
            match time {
                Some(t) => {
                    run.put_sighting(id, Sighting::at(*t));
                    staged.put(id, *t);
                }
                None => {
                    run.forget(id);
                    staged.forget(id);
                }
            }
        }
        let from_run: Vec<(Vec<u8>, Option<i64>, bool)> = run
            .changes()
            .into_iter()
            .map(|(id, c)| (id.to_vec(), c.put.map(|s| s.time), c.forgotten))
            .collect();
        let mut ids: Vec<&Vec<u8>> = staged.puts.keys().chain(&staged.forgets).collect();
        ids.sort();
        ids.dedup();
        let from_staged: Vec<(Vec<u8>, Option<i64>, bool)> = ids
            .into_iter()
            .map(|id| {
                let put = staged.puts.get(id).map(|s| s.time);
                (id.clone(), put, staged.forgets.contains(id))
            })
            .collect();
        assert_eq!(from_run, from_staged);
        assert_eq!(run.stream_time, staged.stream_time);
        assert_eq!(from_run.len(), 6);
    }
}
