//! The state volume: what the processor leaves on disk, and how the programs that look at it
//! (`streamapp-processor inspect`, the agent) find their way around.
//!
//! Each processor pod has a persistent volume of its own, mounted at the state dir. Everything
//! the pod knows locally lives there, so it survives a restart of the container or of the
//! pod:
//!
//! ```text
//! <state-dir>/
//!   health.json                       the health file (its content: crate::health)
//!   FENCED                            this pod's identity was taken by another process: the
//!                                     processor joins again only once its agent confirms the
//!                                     pod is the current one (crate::identity)
//!   tasks/<partition>/                one per input partition whose store is (or was) here
//!     store/                          the task's RocksDB store (with its WAL `*.log` files…)
//!     .checkpoint                     written by a drain, removed when processing starts
//!   quarantine/<partition>-<ms>/      a damaged store moved aside at Unix time <ms>
//!     REASON                          why, in RocksDB's (or the processor's) words
//!     store/, wal/                    the damaged store and its WAL
//!     MOVING                          while the move is unfinished (the processor's own)
//! <wal-dir>/                          optional: a separate volume for the WAL
//!   tasks/<partition>/                …the task's WAL files, when the WAL dir is set
//! ```
//!
//! - [`StateDir`]: where each of these is, for a given state dir and WAL dir.
//! - [`checkpoint`]: the `.checkpoint` file (Kafka Streams' format): reading and writing it.
//! - [`wal_files`]: the WAL files of a store, counted.
//! - [`QuarantinedStore`]: the quarantine folder, listed.
//!
//! The processor writes all of it; the agent and `inspect` only read. The agent reads the
//! volume itself, not only the processor's reports, because a dead processor reports nothing:
//! which is why this contract is here and not in the processor, whose RocksDB the agent must
//! not link.

pub mod checkpoint;
mod layout;
mod quarantine;
mod wal;

use std::io::Write;
use std::path::Path;
use std::time::UNIX_EPOCH;

pub use layout::{HEALTH_FILE, StateDir};
pub use quarantine::{QuarantinedStore, REASON_FILE};
pub use wal::{WalOnDisk, wal_files};

/// Replaces the file at `path` with `bytes` so that a crash leaves either the old file or the
/// new one, never a torn one: written to a temporary file beside it, fsynced, renamed over it,
/// and the directory fsynced (the rename is durable only then). How the processor writes every
/// file on the volume that someone reads after a crash: the health file, checkpoints, the plan
/// of a move into quarantine.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the file at `path`; a file that is not there is fine. The processor's steps on the
/// volume may be repeated after a crash, so removing twice must not be an error.
pub fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A file's modification time in Unix ms, as times on the volume are reported.
fn modified_ms(meta: &std::fs::Metadata) -> Option<i64> {
    let d = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-yet/health.json");
        write_atomically(&path, b"old").unwrap();
        write_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["health.json"]);
    }

    #[test]
    fn removing_a_file_that_is_not_there_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".checkpoint");
        std::fs::write(&path, "0\n0\n").unwrap();
        remove_if_present(&path).unwrap();
        assert!(!path.exists());
        remove_if_present(&path).unwrap();
    }
}
