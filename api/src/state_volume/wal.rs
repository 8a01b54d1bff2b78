//! A store's write-ahead log files, counted. Live WAL files are data RocksDB has not yet
//! flushed into SST files; many or old ones mean flushes are not keeping up, or a WAL volume
//! filling up.

use std::path::Path;

use crate::health::WalFiles;

/// The WAL files found in a directory, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalOnDisk {
    pub files: u64,
    pub bytes: u64,
    /// Modification time (Unix ms) of the oldest live WAL file: a time rather than an age, so
    /// that a reader computes the age when it reports.
    pub oldest_modified_ms: Option<i64>,
}

impl WalOnDisk {
    /// As the health file reports them at `now_ms`. A modification time in the future (a
    /// clock that went back) has no age.
    pub fn at(&self, now_ms: i64) -> WalFiles {
        WalFiles {
            files: self.files,
            bytes: self.bytes,
            oldest_age_seconds: self
                .oldest_modified_ms
                .and_then(|m| u64::try_from(now_ms - m).ok())
                .map(|ms| ms / 1000),
        }
    }
}

/// The WAL files in `dir` (see [`StateDir::wal_files_dir`](super::StateDir::wal_files_dir)):
/// RocksDB's `<number>.log` files; its info logs (`LOG`, `LOG.old.*`) are not WAL files. A
/// missing directory has none.
pub fn wal_files(dir: &Path) -> WalOnDisk {
    let mut wal = WalOnDisk::default();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.ends_with(".log") || name.starts_with("LOG") {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        wal.files += 1;
        wal.bytes += meta.len();
        if let Some(m) = super::modified_ms(&meta) {
            wal.oldest_modified_ms = Some(wal.oldest_modified_ms.map_or(m, |o| o.min(m)));
        }
    }
    wal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_volume::StateDir;

    #[test]
    fn wal_files_are_the_numbered_logs_not_rocksdbs_info_logs_or_ssts() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        let store = state.store_dir(0);
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("000012.log"), vec![0u8; 100]).unwrap();
        std::fs::write(store.join("000013.log"), vec![0u8; 50]).unwrap();
        std::fs::write(store.join("LOG"), "rocksdb info log, not a WAL").unwrap();
        std::fs::write(store.join("LOG.old.1750000000.log"), "an old info log").unwrap();
        std::fs::write(store.join("000011.sst"), "x").unwrap();
        let wal = wal_files(&state.wal_files_dir(0));
        assert_eq!((wal.files, wal.bytes), (2, 150));
        assert!(wal.oldest_modified_ms.is_some_and(|m| m > 0));
        assert_eq!(wal_files(&dir.path().join("missing")), WalOnDisk::default());
    }

    #[test]
    fn wal_files_in_a_separate_wal_dir_are_found_there() {
        let (root, wal_root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let state = StateDir::new(root.path(), Some(wal_root.path().into()));
        std::fs::create_dir_all(state.store_dir(3)).unwrap();
        std::fs::create_dir_all(state.wal_dir(3).unwrap()).unwrap();
        std::fs::write(wal_root.path().join("tasks/3/000004.log"), vec![0u8; 10]).unwrap();
        let wal = wal_files(&state.wal_files_dir(3));
        assert_eq!((wal.files, wal.bytes), (1, 10));
    }

    #[test]
    fn the_health_file_reports_the_age_of_the_oldest_wal_file() {
        let wal = WalOnDisk {
            files: 2,
            bytes: 4096,
            oldest_modified_ms: Some(1_000),
        };
        assert_eq!(
            wal.at(43_999),
            WalFiles {
                files: 2,
                bytes: 4096,
                oldest_age_seconds: Some(42)
            }
        );
        assert_eq!(wal.at(999).oldest_age_seconds, None, "the clock went back");
        assert_eq!(WalOnDisk::default().at(1_000), WalFiles::default());
    }
}
