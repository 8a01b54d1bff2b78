//! Restoring an empty store past RocksDB's write path: the changelog read in sorted runs, each
//! written as an SST file and ingested (moved into the store), so no record goes through the
//! memtable, the WAL or a flush. What a bulk load does; a store that held nothing when its
//! restore began (a lost disk, a pod on a new node, a task new to this pod) is restored so.
//!
//! A run gives the store exactly what [`TaskStore::apply`] of the same records would, only
//! written another way:
//! - within a run, [`Staged`] already keeps each id's latest time and orders forgets and puts;
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

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::path::Path;

use rocksdb::{IngestExternalFileOptions, SstFileWriter};

use super::apply::{Plan, with_id_key};
use super::sighting::{MAX_ENCODED, Sighting};
use super::{ID_PREFIX, Result, Staged, StoreError, TaskStore};

/// Where a run is written before it is ingested. One run at a time per store, so one name; a
/// file a crash left behind is replaced by the next run's.
const RUN_FILE: &str = "restore-run.sst";

/// What a run holds in memory per record, about: its entry in the run's ordered map (the id
/// and its sighting) and the id's own allocation.
const RUN_BYTES_PER_RECORD: usize = 128;

/// The bulk load of one empty store: which ids its runs have put so far.
#[derive(Debug, Default)]
pub struct BulkLoad {
    /// Hashes of the ids put by the runs ingested so far, sorted (duplicates allowed).
    put: Vec<u64>,
    /// Records per run.
    run_records: usize,
}

/// The same hash for the same id, for as long as the process runs (a load lives in one).
fn id_hash(id: &[u8]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(id)
}

impl BulkLoad {
    /// Records per run: a run takes the place of a memtable, in memory as on disk (one file
    /// per run, as one per flush), so it is as large as one.
    pub fn run_records(&self) -> usize {
        self.run_records
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

/// One id's change in a run, in key order.
enum Change<'s> {
    Put(&'s Sighting),
    Forget,
}

impl TaskStore {
    /// A bulk load, if the store holds nothing yet: no id, no changelog offset. Otherwise
    /// its restore applies through [`TaskStore::apply`].
    pub fn bulk_load(&self) -> Result<Option<BulkLoad>> {
        if self.applying.is_some() || self.meta.changelog_offset.is_some() {
            return Ok(None);
        }
        let run_records = (self.database.write_buffer_bytes / RUN_BYTES_PER_RECORD).max(1);
        Ok((!self.database.holds_ids()?).then(|| BulkLoad {
            put: Vec::new(),
            run_records,
        }))
    }

    /// Applies one run of a bulk load: what [`TaskStore::apply`] of `staged` would give, its
    /// data ingested as an SST file, then its offsets and clocks in one batch.
    pub fn apply_run(&mut self, staged: &Staged, load: &mut BulkLoad) -> Result<()> {
        self.settle()?;
        let Plan { meta, cutoff } = self
            .database
            .plan(&self.meta, staged, crate::shared::now_ms());
        let expired = |s: &Sighting| cutoff.is_some_and(|c| s.time < c);
        let mut hashes: Vec<u64> = staged
            .puts
            .iter()
            .filter(|(_, s)| !expired(s))
            .map(|(id, _)| id_hash(id))
            .collect();
        hashes.sort_unstable();
        let met = load.meet(&hashes);
        let run = self.database.path.join(RUN_FILE);
        let mut writer: Option<SstFileWriter> = None;
        let mut value = [0u8; MAX_ENCODED];
        for (id, change) in in_key_order(staged) {
            let entry = match change {
                // Put again after it was forgotten: the put wins, whatever the store held.
                Change::Put(s) if staged.forgets.contains(id) && !expired(s) => Some(s),
                Change::Put(_) if staged.forgets.contains(id) => None,
                Change::Put(s) if expired(s) => continue, // outside the window on arrival
                Change::Put(s) => {
                    let earlier = met.binary_search(&id_hash(id)).is_ok()
                        && self.database.first_seen(id)?.is_some_and(|t| t > s.time);
                    if earlier {
                        continue; // an earlier run put a later time: it stays
                    }
                    Some(s)
                }
                Change::Forget => None,
            };
            let writer = match &mut writer {
                Some(w) => w,
                None => writer.insert(self.database.run_writer(&run)?),
            };
            with_id_key(id, |key| match entry {
                Some(s) => {
                    let len = s.encode(&mut value);
                    writer.put(key, &value[..len])
                }
                None => writer.delete(key),
            })
            .map_err(|e| StoreError::from_rocksdb(&run, e))?;
        }
        if let Some(mut writer) = writer {
            writer
                .finish()
                .map_err(|e| StoreError::from_rocksdb(&run, e))?;
            drop(writer);
            self.database.ingest(&run)?;
        }
        self.meta = self.database.write_meta(meta, cutoff)?;
        Ok(())
    }
}

/// `staged`'s forgets and puts merged into one sequence in key order (an id in both comes
/// once, as its put).
fn in_key_order(staged: &Staged) -> impl Iterator<Item = (&[u8], Change<'_>)> {
    let mut puts = staged.puts.iter().peekable();
    let mut forgets = staged.forgets.iter().peekable();
    std::iter::from_fn(move || match (puts.peek(), forgets.peek()) {
        (Some((p, _)), Some(f)) if f < p => forgets.next().map(|f| (&f[..], Change::Forget)),
        (Some((p, _)), Some(f)) if f == p => {
            forgets.next();
            puts.next().map(|(id, s)| (&id[..], Change::Put(s)))
        }
        (Some(_), _) => puts.next().map(|(id, s)| (&id[..], Change::Put(s))),
        (None, Some(_)) => forgets.next().map(|f| (&f[..], Change::Forget)),
        (None, None) => None,
    })
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

    #[test]
    fn a_run_meets_the_ids_of_earlier_runs_and_joins_them() {
        let mut load = BulkLoad::default();
        assert_eq!(load.meet(&[3, 5, 9]), Vec::<u64>::new());
        assert_eq!(load.meet(&[1, 5, 9, 12]), vec![5, 9]);
        assert_eq!(load.put, vec![1, 3, 5, 5, 9, 9, 12]);
        assert_eq!(load.meet(&[0, 12, 13]), vec![12]);
        assert_eq!(load.meet(&[]), Vec::<u64>::new());
    }

    #[test]
    fn forgets_and_puts_in_key_order_an_id_in_both_once_as_its_put() {
        let mut staged = Staged::default();
        staged.put(b"b", 2);
        staged.forget(b"a");
        staged.forget(b"c");
        staged.put(b"c", 3);
        staged.forget(b"d");
        let order: Vec<(String, Option<i64>)> = in_key_order(&staged)
            .map(|(id, c)| {
                let time = match c {
                    Change::Put(s) => Some(s.time),
                    Change::Forget => None,
                };
                (String::from_utf8_lossy(id).into_owned(), time)
            })
            .collect();
        assert_eq!(
            order,
            [
                ("a".into(), None),
                ("b".into(), Some(2)),
                ("c".into(), Some(3)),
                ("d".into(), None)
            ]
        );
    }
}
