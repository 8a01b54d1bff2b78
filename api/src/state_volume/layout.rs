//! Where each thing is on the state volume (drawn in the [module's doc](super)).

use std::path::{Path, PathBuf};

use super::quarantine::{self, QuarantinedStore};

/// File name of the health file inside the state dir.
pub const HEALTH_FILE: &str = "health.json";
/// File name of the fenced marker inside the state dir.
pub const FENCED_FILE: &str = "FENCED";

/// The state dir and, when one is configured, the separate WAL dir: every path on the volume
/// is asked of this, so that the processor that writes a file and the programs that read it
/// agree on where it is.
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
        self.root.join(HEALTH_FILE)
    }

    /// Written when the processor exits because another process took its identity (what
    /// fenced it, in words); removed once its agent confirmed the pod is the current holder of
    /// its name ([`crate::identity`]).
    pub fn fenced_file(&self) -> PathBuf {
        self.root.join(FENCED_FILE)
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

    /// The folder a damaged store of `partition` moves into at `at_ms` (Unix ms). Named so
    /// that [`StateDir::quarantines`] can tell partition and time from the name alone.
    pub fn quarantined_store_dir(&self, partition: i32, at_ms: i64) -> PathBuf {
        self.quarantine_dir().join(format!("{partition}-{at_ms}"))
    }

    /// The quarantined stores, oldest first. Both the processor (to prune, and for `inspect`)
    /// and the agent (to report) read them this way.
    pub fn quarantines(&self) -> Vec<QuarantinedStore> {
        quarantine::list(&self.quarantine_dir())
    }

    /// Partitions that have a task directory, in order.
    pub fn task_partitions(&self) -> Vec<i32> {
        let mut out: Vec<i32> = std::fs::read_dir(self.root.join("tasks"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_the_one_drawn_in_the_module_doc() {
        let state = StateDir::new("/state", None);
        assert_eq!(state.health_file(), Path::new("/state/health.json"));
        assert_eq!(state.store_dir(3), Path::new("/state/tasks/3/store"));
        assert_eq!(
            state.checkpoint_file(3),
            Path::new("/state/tasks/3/.checkpoint")
        );
        assert_eq!(state.wal_dir(3), None);
        assert_eq!(state.wal_files_dir(3), state.store_dir(3));
        assert_eq!(
            state.quarantined_store_dir(3, 1000),
            Path::new("/state/quarantine/3-1000")
        );
        let with_wal = StateDir::new("/state", Some("/wal".into()));
        assert_eq!(
            with_wal.wal_dir(3).as_deref(),
            Some(Path::new("/wal/tasks/3"))
        );
        assert_eq!(with_wal.wal_files_dir(3), Path::new("/wal/tasks/3"));
        assert_eq!(with_wal.store_dir(3), Path::new("/state/tasks/3/store"));
    }

    #[test]
    fn task_partitions_are_the_numbered_task_directories_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        for name in ["10", "2", "not-a-partition"] {
            std::fs::create_dir_all(dir.path().join("tasks").join(name)).unwrap();
        }
        assert_eq!(state.task_partitions(), vec![2, 10]);
        let missing = StateDir::new(dir.path().join("not-yet-created"), None);
        assert!(
            missing.task_partitions().is_empty(),
            "a new volume has none"
        );
    }
}
