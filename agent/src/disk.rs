//! What the agent checks on the state volume itself, without relying on the processor: the
//! checkpoint files, the RocksDB WAL files, the quarantine folder and the free space. Where
//! these are and how they read is the state volume's contract ([`streamapp_api::state_volume`]),
//! which the processor writes by; the agent links that, not the processor (and its RocksDB).

use std::collections::BTreeMap;

use streamapp_api::state_volume::checkpoint::CheckpointFile;
use streamapp_api::state_volume::{QuarantinedStore, StateDir, WalOnDisk, wal_files};

/// Everything found on disk, at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiskReport {
    /// Per partition that has a task directory.
    pub tasks: BTreeMap<i32, TaskDisk>,
    /// Quarantined stores, oldest first.
    pub quarantines: Vec<QuarantinedStore>,
    /// Bytes available to the processor on the state volume.
    pub free_bytes: Option<u64>,
    /// Size of the state volume.
    pub total_bytes: Option<u64>,
}

/// One task directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskDisk {
    /// The drain's `.checkpoint` file, when there is one.
    pub checkpoint: Option<CheckpointFile>,
    pub wal: WalOnDisk,
}

/// Looks at the state volume. Missing pieces are simply absent from the report: an empty or
/// half-written state dir is a normal sight while a processor starts.
pub fn inspect(state: &StateDir) -> DiskReport {
    let mut tasks = BTreeMap::new();
    for partition in state.task_partitions() {
        let task = TaskDisk {
            checkpoint: CheckpointFile::read(&state.checkpoint_file(partition)),
            wal: wal_files(&state.wal_files_dir(partition)),
        };
        tasks.insert(partition, task);
    }
    let (free_bytes, total_bytes) = match rustix::fs::statvfs(state.root()) {
        Ok(s) => (
            Some(s.f_bavail.saturating_mul(s.f_frsize)),
            Some(s.f_blocks.saturating_mul(s.f_frsize)),
        ),
        Err(_) => (None, None),
    };
    DiskReport {
        tasks,
        quarantines: state.quarantines(),
        free_bytes,
        total_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::state_volume::checkpoint::CheckpointEntry;

    #[test]
    fn inspect_finds_checkpoints_wal_files_quarantines_and_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        let store = dir.path().join("tasks/0/store");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("000012.log"), vec![0u8; 100]).unwrap();
        std::fs::write(store.join("000013.log"), vec![0u8; 50]).unwrap();
        std::fs::write(store.join("LOG"), "rocksdb info log, not a WAL").unwrap();
        std::fs::write(store.join("000011.sst"), "x").unwrap();
        std::fs::write(
            dir.path().join("tasks/0/.checkpoint"),
            "0\n2\napp-changelog 0 42\nin 0 100\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("tasks/1/store")).unwrap();
        for (name, reason) in [
            ("1-2000", "Corruption: block checksum mismatch\n"),
            ("0-1000", "missing sst"),
        ] {
            let q = dir.path().join("quarantine").join(name);
            std::fs::create_dir_all(&q).unwrap();
            std::fs::write(q.join("REASON"), reason).unwrap();
        }

        let report = inspect(&state);

        assert_eq!(report.tasks.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        let t0 = &report.tasks[&0];
        assert_eq!((t0.wal.files, t0.wal.bytes), (2, 150));
        assert!(t0.wal.oldest_modified_ms.is_some());
        let cp = t0.checkpoint.as_ref().expect("checkpoint found");
        assert_eq!(
            cp.entries,
            Ok(vec![
                CheckpointEntry {
                    topic: "app-changelog".into(),
                    partition: 0,
                    offset: 42
                },
                CheckpointEntry {
                    topic: "in".into(),
                    partition: 0,
                    offset: 100
                },
            ])
        );
        assert!(cp.written_at_ms > 0);
        assert_eq!(report.tasks[&1], TaskDisk::default());
        let found: Vec<_> = report
            .quarantines
            .iter()
            .map(|q| (q.partition, q.at_ms, q.reason.as_str()))
            .collect();
        assert_eq!(
            found,
            vec![
                (0, 1000, "missing sst"),
                (1, 2000, "Corruption: block checksum mismatch")
            ]
        );
        assert!(
            report.free_bytes.unwrap() > 0
                && report.total_bytes.unwrap() >= report.free_bytes.unwrap()
        );
    }

    #[test]
    fn wal_files_in_a_separate_wal_dir_are_looked_for_there() {
        let state = tempfile::tempdir().unwrap();
        let wal = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(state.path().join("tasks/3/store")).unwrap();
        std::fs::create_dir_all(wal.path().join("tasks/3")).unwrap();
        std::fs::write(wal.path().join("tasks/3/000004.log"), vec![0u8; 10]).unwrap();
        let report = inspect(&StateDir::new(state.path(), Some(wal.path().into())));
        assert_eq!(
            (report.tasks[&3].wal.files, report.tasks[&3].wal.bytes),
            (1, 10)
        );
    }

    #[test]
    fn an_empty_state_dir_is_an_empty_report_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let report = inspect(&StateDir::new(dir.path().join("not-yet-created"), None));
        assert!(report.tasks.is_empty() && report.quarantines.is_empty());
        assert_eq!(report.free_bytes, None);
    }
}
