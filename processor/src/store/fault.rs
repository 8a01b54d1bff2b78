//! What a failed store operation means for the task: damage (quarantine the store and rebuild
//! it from the changelog) or unavailability (back off and retry the same store later).
//!
//! Only what proves the files themselves wrong counts as damage: RocksDB's `Corruption`, a file
//! the store needs that is gone, metadata that makes no sense, a store of another changelog.
//! A full disk, an I/O error, a LOCK held by another process or options RocksDB refuses say
//! nothing about the data: quarantining then would move a good store aside (and, on a full
//! disk, the rebuild fails too). Those back off instead.

use std::path::{Path, PathBuf};

use streamapp_api::health::StoreUnavailable;

/// Why a store could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store's files are damaged or missing, or they belong to another changelog:
    /// quarantine the store and rebuild it from the changelog.
    #[error("store {path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
    /// The store cannot be used for now; its files are not known to be wrong. Back off and
    /// try the same store again.
    #[error("store {path} is unavailable ({kind:?}): {reason}")]
    Unavailable {
        path: PathBuf,
        kind: StoreUnavailable,
        reason: String,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The two answers to a failure, without the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Damaged,
    Unavailable(StoreUnavailable),
}

impl StoreError {
    pub fn from_rocksdb(path: &Path, e: rocksdb::Error) -> Self {
        let reason = e.clone().into_string();
        Self::new(path, classify_rocksdb(e.kind(), &reason), reason)
    }

    /// A failure of the file system around RocksDB (creating the store's directories).
    pub fn from_io(path: &Path, what: &str, e: &std::io::Error) -> Self {
        let reason = format!("{what}: {e}");
        Self::new(path, Fault::Unavailable(classify_io(e)), reason)
    }

    pub fn damaged(path: &Path, reason: impl Into<String>) -> Self {
        StoreError::Damaged {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn new(path: &Path, fault: Fault, reason: String) -> Self {
        match fault {
            Fault::Damaged => StoreError::Damaged {
                path: path.to_path_buf(),
                reason,
            },
            Fault::Unavailable(kind) => StoreError::Unavailable {
                path: path.to_path_buf(),
                kind,
                reason,
            },
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            StoreError::Damaged { .. } => Fault::Damaged,
            StoreError::Unavailable { kind, .. } => Fault::Unavailable(*kind),
        }
    }

    /// The message without the path.
    pub fn reason(&self) -> &str {
        match self {
            StoreError::Damaged { reason, .. } | StoreError::Unavailable { reason, .. } => reason,
        }
    }
}

/// Damage or unavailability, from RocksDB's error kind and message.
pub fn classify_rocksdb(kind: rocksdb::ErrorKind, message: &str) -> Fault {
    use rocksdb::ErrorKind::*;
    let lower = message.to_ascii_lowercase();
    match kind {
        Corruption => Fault::Damaged,
        // A file the store's MANIFEST lists is gone: the store cannot be what its offsets say.
        IOError | NotFound if is_missing_store_file(&lower) => Fault::Damaged,
        IOError if is_disk_full(&lower) => Fault::Unavailable(StoreUnavailable::DiskFull),
        IOError if lower.contains("lock") => Fault::Unavailable(StoreUnavailable::Locked),
        InvalidArgument | NotSupported => Fault::Unavailable(StoreUnavailable::Incompatible),
        _ => Fault::Unavailable(StoreUnavailable::Io),
    }
}

/// Unavailability from an error of the file system.
pub fn classify_io(e: &std::io::Error) -> StoreUnavailable {
    // ENOSPC and EDQUOT.
    if matches!(e.raw_os_error(), Some(28 | 122)) || is_disk_full(&e.to_string().to_lowercase()) {
        StoreUnavailable::DiskFull
    } else {
        StoreUnavailable::Io
    }
}

fn is_disk_full(lower: &str) -> bool {
    lower.contains("no space left") || lower.contains("disk quota exceeded")
}

fn is_missing_store_file(lower: &str) -> bool {
    lower.contains("no such file or directory")
        && [".sst", "manifest", "current", ".blob"]
            .iter()
            .any(|f| lower.contains(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocksdb::ErrorKind;

    #[test]
    fn only_corruption_and_missing_files_are_damage() {
        assert_eq!(
            classify_rocksdb(
                ErrorKind::Corruption,
                "Corruption: block checksum mismatch: stored = 1, computed = 2 in 000012.sst"
            ),
            Fault::Damaged
        );
        assert_eq!(
            classify_rocksdb(
                ErrorKind::IOError,
                "IO error: No such file or directory: While open a file for random read: /s/000009.sst: No such file or directory"
            ),
            Fault::Damaged
        );
    }

    #[test]
    fn a_full_disk_a_held_lock_an_io_error_and_refused_options_are_not_damage() {
        use StoreUnavailable::*;
        for (kind, message, expected) in [
            (
                ErrorKind::IOError,
                "IO error: No space left on device: While appending to file: /s/000004.log: No space left on device",
                DiskFull,
            ),
            (
                ErrorKind::IOError,
                "IO error: While lock file: /s/LOCK: Resource temporarily unavailable",
                Locked,
            ),
            (
                ErrorKind::IOError,
                "IO error: While fsync: a file descriptor: Input/output error",
                Io,
            ),
            (
                ErrorKind::InvalidArgument,
                "Invalid argument: /s/CURRENT: does not exist (create_if_missing is false)",
                Incompatible,
            ),
            (
                ErrorKind::NotSupported,
                "Not implemented: Unsupported compression method",
                Incompatible,
            ),
            (ErrorKind::Busy, "Resource busy", Io),
        ] {
            assert_eq!(
                classify_rocksdb(kind, message),
                Fault::Unavailable(expected),
                "{message}"
            );
        }
    }

    #[test]
    fn enospc_from_the_file_system_is_a_full_disk() {
        let e = std::io::Error::from_raw_os_error(28);
        assert_eq!(classify_io(&e), StoreUnavailable::DiskFull);
        let e = std::io::Error::from_raw_os_error(5);
        assert_eq!(classify_io(&e), StoreUnavailable::Io);
    }
}
