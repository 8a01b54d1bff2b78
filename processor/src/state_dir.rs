//! Where things live in the state directory (the pod's state volume):
//!
//! ```text
//! <state-dir>/health.json                    the health file (see streamapp_api::health)
//! <state-dir>/tasks/<partition>/store/       the task's RocksDB store
//! <state-dir>/tasks/<partition>/.checkpoint  written by a drain, removed when processing starts
//! <state-dir>/quarantine/<partition>-<ms>/   damaged stores kept for forensics (bounded)
//! <wal-dir>/tasks/<partition>/               RocksDB WAL files, when a separate WAL dir is set
//! ```

use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
    wal_root: Option<PathBuf>,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>, wal_root: Option<PathBuf>) -> Self {
        StateDir {
            root: root.into(),
            wal_root,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn health_file(&self) -> PathBuf {
        self.root.join(streamapp_api::health::HEALTH_FILE)
    }

    pub fn task_dir(&self, partition: i32) -> PathBuf {
        self.root.join("tasks").join(partition.to_string())
    }

    pub fn store_dir(&self, partition: i32) -> PathBuf {
        self.task_dir(partition).join("store")
    }

    pub fn checkpoint_file(&self, partition: i32) -> PathBuf {
        self.task_dir(partition).join(".checkpoint")
    }

    /// The separate WAL directory of a task, when one is configured.
    pub fn wal_dir(&self, partition: i32) -> Option<PathBuf> {
        self.wal_root
            .as_ref()
            .map(|w| w.join("tasks").join(partition.to_string()))
    }

    /// Where a task's WAL files are: the separate WAL dir, or the store itself.
    pub fn wal_files_dir(&self, partition: i32) -> PathBuf {
        self.wal_dir(partition)
            .unwrap_or_else(|| self.store_dir(partition))
    }

    pub fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }

    /// Partitions that have a task directory.
    pub fn task_partitions(&self) -> Vec<i32> {
        let mut out: Vec<i32> = std::fs::read_dir(self.root.join("tasks"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        out.sort();
        out
    }
}

/// WAL files (`*.log`) in `dir`: count, total bytes, age of the oldest in seconds.
pub fn wal_files(dir: &Path) -> streamapp_api::health::WalFiles {
    let mut files = 0;
    let mut bytes = 0;
    let mut oldest: Option<std::time::SystemTime> = None;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().ends_with(".log") || name.to_string_lossy().starts_with("LOG") {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        files += 1;
        bytes += meta.len();
        if let Ok(m) = meta.modified() {
            oldest = Some(oldest.map_or(m, |o| o.min(m)));
        }
    }
    streamapp_api::health::WalFiles {
        files,
        bytes,
        oldest_age_seconds: oldest.and_then(|o| o.elapsed().ok()).map(|d| d.as_secs()),
    }
}
