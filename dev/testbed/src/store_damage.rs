//! Damage to a stopped processor's RocksDB store, as a failing disk or an unclean stop leaves
//! it: what the processor's recovery (and the agent's report of it) is tested against.

use std::path::{Path, PathBuf};

/// One kind of damage to a store directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// The newest write-ahead log cut to half its length (a torn tail).
    TruncateWal,
    /// 64 bytes flipped a third of the way into the write-ahead log.
    FlipWalBytes,
    /// 64 bytes flipped a third of the way into the largest table file.
    FlipSstBytes,
    /// The largest table file gone.
    DeleteSst,
}

/// Applies `damage` to the RocksDB store in `store` (the processor must not be running).
pub fn damage(store: &Path, damage: Damage) {
    match damage {
        Damage::TruncateWal => {
            let wal = largest(store, "log");
            let len = std::fs::metadata(&wal).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&wal)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }
        Damage::FlipWalBytes => flip_bytes(&largest(store, "log")),
        Damage::FlipSstBytes => flip_bytes(&largest(store, "sst")),
        Damage::DeleteSst => std::fs::remove_file(largest(store, "sst")).unwrap(),
    }
}

/// The largest file of `store` with extension `ext` (RocksDB's own `LOG*` info logs aside).
fn largest(store: &Path, ext: &str) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(store)
        .unwrap_or_else(|e| panic!("reading {}: {e}", store.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files
        .iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == ext)
                && !p.file_name().unwrap().to_string_lossy().starts_with("LOG")
        })
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .cloned()
        .unwrap_or_else(|| panic!("no .{ext} file in {}: {files:?}", store.display()))
}

fn flip_bytes(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 3;
    let end = (mid + 64).min(bytes.len());
    for b in &mut bytes[mid..end] {
        *b ^= 0xA5;
    }
    std::fs::write(path, bytes).unwrap();
}
