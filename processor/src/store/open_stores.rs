//! The stores this process has open, readable from outside the processing loop: the lookup
//! endpoint reads them while the engine goes on.
//!
//! A reader holds a store's database only through a weak handle it upgrades for one lookup
//! (microseconds), as the background verifier does; a store that is closed meanwhile ends its
//! registration when it is dropped. Reads go to RocksDB only: what committed transactions
//! wrote, never the staged writes of an open one (nor a committed batch still being written
//! on the apply thread: a lookup may lag a commit by that batch, never lead it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rocksdb::DB;

use super::sighting::Sighting;
use super::{Result, StoreError, TaskStore, id_key};

/// The registry of open stores (cheap to clone: shared).
#[derive(Clone, Default)]
pub struct OpenStores {
    stores: Arc<Mutex<BTreeMap<u64, Reader>>>,
}

/// What a lookup needs of one store.
#[derive(Clone)]
struct Reader {
    partition: i32,
    db: Weak<DB>,
    closing: Arc<AtomicBool>,
    watermark: Arc<AtomicI64>,
    path: std::path::PathBuf,
}

/// A store's place in the registry; dropping it (with the store) removes the store.
pub(super) struct Registration {
    stores: OpenStores,
    store_id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stores.lock().remove(&self.store_id);
    }
}

/// An id as one store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub sighting: Sighting,
    /// Older than the cutoff of the last batch written: no longer remembered, not yet
    /// compacted away.
    pub expired: bool,
}

impl OpenStores {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Reader>> {
        // A panic while the map was held left it whole (inserts and removes only).
        self.stores.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `store` (the store of `partition`) readable until it is dropped.
    pub fn register(&self, partition: i32, store: &mut TaskStore) {
        let reader = Reader {
            partition,
            db: Arc::downgrade(&store.database.db),
            closing: store.closing.clone(),
            watermark: store.database.watermark.clone(),
            path: store.database.path.clone(),
        };
        self.lock().insert(store.id, reader);
        store.registration = Some(Registration {
            stores: self.clone(),
            store_id: store.id,
        });
    }

    /// The partitions whose stores are open, in order (a partition twice when two stores of
    /// it are open for a moment, as during a hand-over: once here).
    pub fn partitions(&self) -> Vec<i32> {
        let mut partitions: Vec<i32> = self.lock().values().map(|r| r.partition).collect();
        partitions.sort_unstable();
        partitions.dedup();
        partitions
    }

    /// `id` in the open stores of `partition` (the first that answers; `None` when none holds
    /// it or none is open any more). The registry's lock is held only to copy the handles.
    pub fn look_up(
        &self,
        partition: i32,
        id: &[u8],
        input_topic: Option<&Arc<str>>,
    ) -> Result<Option<Held>> {
        let readers: Vec<Reader> = self
            .lock()
            .values()
            .filter(|r| r.partition == partition)
            .cloned()
            .collect();
        for reader in readers {
            let Some(db) = reader.db.upgrade() else {
                continue;
            };
            if reader.closing.load(Ordering::SeqCst) {
                continue; // being closed: let it go
            }
            let value = db
                .get_pinned(id_key(id))
                .map_err(|e| StoreError::from_rocksdb(&reader.path, e))?;
            let Some(value) = value else {
                return Ok(None);
            };
            let sighting = Sighting::decode(&value, input_topic).ok_or_else(|| {
                StoreError::damaged(&reader.path, "a stored value is not a sighting")
            })?;
            let expired = sighting.time < reader.watermark.load(Ordering::Relaxed);
            return Ok(Some(Held { sighting, expired }));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Staged;
    use crate::store::tests::{changelog, try_open};

    #[test]
    fn a_registered_store_answers_committed_ids_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let stores = OpenStores::default();
        let mut store = try_open(dir.path(), &changelog(4)).unwrap();
        stores.register(4, &mut store);
        assert_eq!(stores.partitions(), [4]);
        let mut staged = Staged::default();
        staged.put(b"cmd-1", 1_000);
        assert_eq!(
            stores.look_up(4, b"cmd-1", None).unwrap(),
            None,
            "staged only"
        );
        store.apply(&staged).unwrap();
        assert_eq!(
            stores.look_up(4, b"cmd-1", None).unwrap(),
            Some(Held {
                sighting: Sighting::at(1_000),
                expired: false
            })
        );
        assert_eq!(
            stores.look_up(3, b"cmd-1", None).unwrap(),
            None,
            "another partition"
        );
        drop(store);
        assert!(stores.partitions().is_empty());
        assert_eq!(stores.look_up(4, b"cmd-1", None).unwrap(), None);
    }

    #[test]
    fn an_id_past_the_written_cutoff_is_expired_until_compaction_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        let stores = OpenStores::default();
        let mut store = try_open(dir.path(), &changelog(0)).unwrap();
        stores.register(0, &mut store);
        let hour = 3_600_000;
        let now = 100 * hour;
        let mut staged = Staged::default();
        staged.put(b"x", now - 2 * hour);
        store
            .apply_at(&staged, now - 2 * hour, crate::store::Existing::Check)
            .unwrap();
        assert!(!stores.look_up(0, b"x", None).unwrap().unwrap().expired);
        let mut staged = Staged::default();
        staged.observe_time(now + 1);
        store
            .apply_at(&staged, now, crate::store::Existing::Check)
            .unwrap();
        assert!(stores.look_up(0, b"x", None).unwrap().unwrap().expired);
        assert_eq!(
            store.first_seen(b"x").unwrap(),
            None,
            "as the engine sees it"
        );
        store.compact().unwrap();
        assert_eq!(stores.look_up(0, b"x", None).unwrap(), None);
    }
}
