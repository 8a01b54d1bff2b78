//! What the agent checks on the state volume itself, without relying on the processor: the
//! checkpoint files, the RocksDB WAL files, the quarantine folder and the free space.
//!
//! The layout is the processor's (`processor/src/state_dir.rs`), repeated here on purpose so
//! the agent does not link the processor (and RocksDB):
//!
//! ```text
//! <state-dir>/health.json                    the processor's health file
//! <state-dir>/tasks/<partition>/store/       a task's RocksDB store (WAL `*.log` files here…)
//! <wal-dir>/tasks/<partition>/               …or here, when a separate WAL dir is configured
//! <state-dir>/tasks/<partition>/.checkpoint  written by a drain, removed when processing starts
//! <state-dir>/quarantine/<partition>-<ms>/   damaged stores, with a REASON file
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use streamapp_api::health::HEALTH_FILE;

/// Where things are on the state volume(s).
#[derive(Clone, Debug)]
pub struct StateLayout {
    pub root: PathBuf,
    pub wal_root: Option<PathBuf>,
}

impl StateLayout {
    pub fn new(root: impl Into<PathBuf>, wal_root: Option<PathBuf>) -> Self {
        StateLayout {
            root: root.into(),
            wal_root,
        }
    }

    pub fn health_file(&self) -> PathBuf {
        self.root.join(HEALTH_FILE)
    }

    fn task_dir(&self, partition: i32) -> PathBuf {
        self.root.join("tasks").join(partition.to_string())
    }

    fn checkpoint_file(&self, partition: i32) -> PathBuf {
        self.task_dir(partition).join(".checkpoint")
    }

    /// The directory holding a task's WAL files: the separate WAL dir, or the store.
    fn wal_files_dir(&self, partition: i32) -> PathBuf {
        match &self.wal_root {
            Some(w) => w.join("tasks").join(partition.to_string()),
            None => self.task_dir(partition).join("store"),
        }
    }

    fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }
}

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

/// A `.checkpoint` file (Kafka Streams format).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointFile {
    /// Its modification time: when the drain wrote it.
    pub written_at_ms: i64,
    /// `(topic, partition, offset)` entries, or why the file does not parse.
    pub entries: Result<Vec<(String, i32, i64)>, String>,
}

/// RocksDB WAL files of a store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WalOnDisk {
    pub files: u64,
    pub bytes: u64,
    /// Modification time of the oldest live WAL file (its age is computed when reporting).
    pub oldest_modified_ms: Option<i64>,
}

/// A quarantined store: `quarantine/<partition>-<ms>/REASON` (listed the processor's way).
pub use streamapp_api::health::QuarantinedStore;

/// Looks at the state volume. Missing pieces are simply absent from the report: an empty or
/// half-written state dir is a normal sight while a processor starts.
pub fn inspect(layout: &StateLayout) -> DiskReport {
    let mut tasks = BTreeMap::new();
    for partition in task_partitions(&layout.root) {
        let task = TaskDisk {
            checkpoint: read_checkpoint(&layout.checkpoint_file(partition)),
            wal: wal_files(&layout.wal_files_dir(partition)),
        };
        tasks.insert(partition, task);
    }
    let (free_bytes, total_bytes) = match rustix::fs::statvfs(&layout.root) {
        Ok(s) => (
            Some(s.f_bavail.saturating_mul(s.f_frsize)),
            Some(s.f_blocks.saturating_mul(s.f_frsize)),
        ),
        Err(_) => (None, None),
    };
    DiskReport {
        tasks,
        quarantines: streamapp_api::health::list_quarantines(&layout.quarantine_dir()),
        free_bytes,
        total_bytes,
    }
}

fn task_partitions(root: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_dir(root.join("tasks"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    out.sort_unstable();
    out
}

fn modified_ms(meta: &std::fs::Metadata) -> Option<i64> {
    let d = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

fn read_checkpoint(path: &Path) -> Option<CheckpointFile> {
    let meta = std::fs::metadata(path).ok()?;
    let entries = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| parse_checkpoint(&t));
    Some(CheckpointFile {
        written_at_ms: modified_ms(&meta).unwrap_or_default(),
        entries,
    })
}

/// Parses a Kafka-Streams-style checkpoint: `0`, the entry count, `topic partition offset`
/// lines.
pub fn parse_checkpoint(text: &str) -> Result<Vec<(String, i32, i64)>, String> {
    let mut lines = text.lines();
    if lines.next() != Some("0") {
        return Err("unknown checkpoint version".into());
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or("missing entry count")?;
    let entries = lines
        .map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            match parts[..] {
                [topic, p, o] => Ok((
                    topic.to_string(),
                    p.parse()
                        .map_err(|_| format!("malformed partition in {l:?}"))?,
                    o.parse()
                        .map_err(|_| format!("malformed offset in {l:?}"))?,
                )),
                _ => Err(format!("malformed entry {l:?}")),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    if entries.len() != count {
        return Err(format!("says {count} entries, has {}", entries.len()));
    }
    Ok(entries)
}

/// WAL files are RocksDB's `<number>.log`; its info logs (`LOG`, `LOG.old.*`) are not.
fn wal_files(dir: &Path) -> WalOnDisk {
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
        if let Some(m) = modified_ms(&meta) {
            wal.oldest_modified_ms = Some(wal.oldest_modified_ms.map_or(m, |o| o.min(m)));
        }
    }
    wal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_finds_checkpoints_wal_files_quarantines_and_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let layout = StateLayout::new(dir.path(), None);
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

        let report = inspect(&layout);

        assert_eq!(report.tasks.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        let t0 = &report.tasks[&0];
        assert_eq!((t0.wal.files, t0.wal.bytes), (2, 150));
        assert!(t0.wal.oldest_modified_ms.is_some());
        let cp = t0.checkpoint.as_ref().expect("checkpoint found");
        assert_eq!(
            cp.entries,
            Ok(vec![
                ("app-changelog".to_string(), 0, 42),
                ("in".to_string(), 0, 100)
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
    fn wal_files_in_a_separate_wal_dir_are_found_there() {
        let state = tempfile::tempdir().unwrap();
        let wal = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(state.path().join("tasks/3/store")).unwrap();
        std::fs::create_dir_all(wal.path().join("tasks/3")).unwrap();
        std::fs::write(wal.path().join("tasks/3/000004.log"), vec![0u8; 10]).unwrap();
        let report = inspect(&StateLayout::new(state.path(), Some(wal.path().into())));
        assert_eq!(
            (report.tasks[&3].wal.files, report.tasks[&3].wal.bytes),
            (1, 10)
        );
    }

    #[test]
    fn an_empty_state_dir_is_an_empty_report_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let report = inspect(&StateLayout::new(dir.path().join("not-yet-created"), None));
        assert!(report.tasks.is_empty() && report.quarantines.is_empty());
        assert_eq!(report.free_bytes, None);
    }

    #[test]
    fn malformed_checkpoints_say_what_is_wrong() {
        assert_eq!(
            parse_checkpoint("1\n0\n"),
            Err("unknown checkpoint version".into())
        );
        assert_eq!(
            parse_checkpoint("0\n2\nt 0 1\n"),
            Err("says 2 entries, has 1".into())
        );
        assert!(
            parse_checkpoint("0\n1\nt zero 1\n")
                .unwrap_err()
                .contains("partition")
        );
        assert_eq!(parse_checkpoint("0\n0\n"), Ok(vec![]));
    }
}
