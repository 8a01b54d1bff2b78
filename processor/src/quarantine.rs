//! Moving damaged stores aside instead of crash-looping on them.
//!
//! A store that RocksDB cannot open, or that reports corruption, is renamed into
//! `<state-dir>/quarantine/<partition>-<unix-ms>/` with a `REASON` file, and the task rebuilds
//! its store from the changelog. Only the newest [`KEEP`] quarantines are kept, so a flapping
//! disk cannot fill the volume.

use std::path::Path;

use streamapp_api::health::Quarantine;

use crate::state_dir::StateDir;

/// Quarantined stores kept per state dir.
pub const KEEP: usize = 3;

/// Moves the task's store (and its separate WAL dir, if any) into quarantine.
pub fn quarantine(
    state: &StateDir,
    partition: i32,
    reason: &str,
    now_ms: i64,
) -> std::io::Result<Quarantine> {
    let target = state.quarantine_dir().join(format!("{partition}-{now_ms}"));
    std::fs::create_dir_all(&target)?;
    let store = state.store_dir(partition);
    if store.exists() {
        std::fs::rename(&store, target.join("store"))?;
    }
    if let Some(wal) = state.wal_dir(partition)
        && wal.exists()
    {
        // The WAL volume may be another filesystem: copy what can be copied, then remove.
        if std::fs::rename(&wal, target.join("wal")).is_err() {
            copy_dir(&wal, &target.join("wal"))?;
            std::fs::remove_dir_all(&wal)?;
        }
    }
    // A checkpoint must not vouch for the store that replaces this one.
    crate::checkpoint::remove(&state.checkpoint_file(partition))?;
    std::fs::write(target.join("REASON"), reason)?;
    prune(&state.quarantine_dir(), KEEP)?;
    Ok(Quarantine {
        at_ms: now_ms,
        reason: reason.into(),
        path: target.display().to_string(),
    })
}

fn prune(dir: &Path, keep: usize) -> std::io::Result<()> {
    let all = streamapp_api::health::list_quarantines(dir);
    for q in all.iter().take(all.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(&q.path)?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()))?;
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_moves_the_store_and_keeps_only_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        for i in 0..5 {
            std::fs::create_dir_all(state.store_dir(0)).unwrap();
            std::fs::write(state.store_dir(0).join("CURRENT"), "x").unwrap();
            std::fs::write(state.checkpoint_file(0), "0\n0\n").unwrap();
            let q = quarantine(&state, 0, &format!("damage {i}"), 1000 + i).unwrap();
            assert!(!state.store_dir(0).exists());
            assert!(
                !state.checkpoint_file(0).exists(),
                "the checkpoint must not survive"
            );
            assert!(Path::new(&q.path).join("store/CURRENT").exists());
        }
        let kept = streamapp_api::health::list_quarantines(&state.quarantine_dir());
        assert_eq!(kept.len(), KEEP);
        assert_eq!(kept.last().unwrap().reason, "damage 4");
    }
}
