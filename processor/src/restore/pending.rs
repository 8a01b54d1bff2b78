//! What a partition's restore has read and not written yet: a chunk for RocksDB's write path,
//! or a bulk load's run (`store/ingest.rs`), behind one interface for the reader's loop.

use crate::store::{BulkLoad, Run, Sighting, Staged, StoreError, TaskStore};

/// Records applied to RocksDB per chunk while restoring through the write path.
pub(super) const APPLY_CHUNK: usize = 10_000;

/// What a partition's restore has read and not written yet.
pub(super) enum Pending {
    /// Applied through RocksDB's write path every [`APPLY_CHUNK`] records and at the end of
    /// each step.
    Chunk(Staged),
    /// A bulk load's run: written once it is as large as the load's part of the memtable
    /// budget ([`BulkLoad::run_records`]) or the partition's end is reached, and kept from one
    /// step to the next meanwhile.
    Run(BulkLoad, Run),
}

impl Pending {
    pub(super) fn chunk() -> Self {
        Pending::Chunk(Staged::default())
    }

    pub(super) fn put_sighting(&mut self, id: &[u8], sighting: Sighting) {
        match self {
            Pending::Chunk(chunk) => chunk.put_sighting(id, sighting),
            Pending::Run(_, run) => run.put_sighting(id, sighting),
        }
    }

    pub(super) fn forget(&mut self, id: &[u8]) {
        match self {
            Pending::Chunk(chunk) => chunk.forget(id),
            Pending::Run(_, run) => run.forget(id),
        }
    }

    pub(super) fn changelog_offset(&mut self) -> &mut Option<i64> {
        match self {
            Pending::Chunk(chunk) => &mut chunk.changelog_offset,
            Pending::Run(_, run) => &mut run.changelog_offset,
        }
    }

    /// The record at `offset` is read (and staged, unless it was skipped).
    pub(super) fn read_through(&mut self, offset: i64) {
        *self.changelog_offset() = Some(offset + 1);
    }

    pub(super) fn full(&self) -> bool {
        match self {
            Pending::Chunk(chunk) => chunk.changes() >= APPLY_CHUNK,
            Pending::Run(load, run) => run.records() >= load.run_records(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Pending::Chunk(chunk) => chunk.is_empty(),
            Pending::Run(_, run) => run.is_empty(),
        }
    }

    /// Writes what is pending into `store` and starts over (also when that fails: the
    /// partition's restore then fails). How many changes were written.
    pub(super) fn apply(&mut self, store: &mut TaskStore) -> Result<u64, StoreError> {
        match self {
            Pending::Chunk(chunk) => {
                let n = chunk.changes() as u64;
                let applied = store.apply(chunk);
                chunk.clear();
                applied.map(|()| n)
            }
            Pending::Run(load, run) => {
                let n = run.records() as u64;
                let applied = store.apply_run(run, load);
                run.clear();
                applied.map(|()| n)
            }
        }
    }
}
