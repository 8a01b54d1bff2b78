//! Moving damaged stores aside instead of crash-looping on them.
//!
//! A damaged store (see [`crate::store::Fault`]) is renamed into
//! `<state-dir>/quarantine/<partition>-<unix-ms>/` with a `REASON` file, and the task rebuilds
//! its store from the changelog.
//!
//! Quarantined copies are pruned to the newest [`KEEP`], but only once a healthy store exists
//! again, and never the newest copy of a partition that has no healthy store: until the
//! rebuild succeeded, that copy may be the only one holding the ids. The task lifecycle stops
//! quarantining a partition whose rebuilds keep failing (see
//! [`crate::lifecycle::MAX_REBUILDS_IN_A_ROW`]), so the folder stays bounded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use streamapp_api::health::{Quarantine, QuarantinedStore};

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
    Ok(Quarantine {
        at_ms: now_ms,
        reason: reason.into(),
        path: target.display().to_string(),
    })
}

/// Deletes old quarantined copies: see [`to_prune`]. `unhealthy` are the partitions without a
/// healthy store in this process.
pub fn prune(state: &StateDir, keep: usize, unhealthy: &BTreeSet<i32>) -> std::io::Result<()> {
    let all = streamapp_api::health::list_quarantines(&state.quarantine_dir());
    for path in to_prune(&all, keep, unhealthy) {
        std::fs::remove_dir_all(path)?;
    }
    Ok(())
}

/// Which of `all` (oldest first) to delete: all but the newest `keep`, except the newest copy
/// of each partition in `unhealthy`.
pub fn to_prune(all: &[QuarantinedStore], keep: usize, unhealthy: &BTreeSet<i32>) -> Vec<PathBuf> {
    let newest_of_unhealthy: BTreeSet<&Path> = unhealthy
        .iter()
        .filter_map(|p| all.iter().rfind(|q| q.partition == *p))
        .map(|q| q.path.as_path())
        .collect();
    all.iter()
        .take(all.len().saturating_sub(keep))
        .filter(|q| !newest_of_unhealthy.contains(q.path.as_path()))
        .map(|q| q.path.clone())
        .collect()
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

    fn q(partition: i32, at_ms: i64) -> QuarantinedStore {
        QuarantinedStore {
            path: PathBuf::from(format!("/q/{partition}-{at_ms}")),
            partition,
            at_ms,
            reason: String::new(),
        }
    }

    #[test]
    fn pruning_keeps_the_newest_and_the_only_copy_of_a_partition_without_a_healthy_store() {
        // Oldest first: partition 1's only copy is the oldest of all.
        let all = [q(1, 1), q(0, 2), q(0, 3), q(0, 4), q(0, 5)];
        let healthy = BTreeSet::new();
        assert_eq!(
            to_prune(&all, 3, &healthy),
            vec![PathBuf::from("/q/1-1"), PathBuf::from("/q/0-2")]
        );
        let unhealthy = BTreeSet::from([1]);
        assert_eq!(
            to_prune(&all, 3, &unhealthy),
            vec![PathBuf::from("/q/0-2")],
            "partition 1 has no healthy store: its copy stays"
        );
        assert!(to_prune(&all[..3], 3, &healthy).is_empty());
    }

    #[test]
    fn quarantine_moves_the_store_and_pruning_keeps_only_the_newest() {
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
        assert_eq!(
            streamapp_api::health::list_quarantines(&state.quarantine_dir()).len(),
            5,
            "quarantining never deletes"
        );
        prune(&state, KEEP, &BTreeSet::new()).unwrap();
        let kept = streamapp_api::health::list_quarantines(&state.quarantine_dir());
        assert_eq!(kept.len(), KEEP);
        assert_eq!(kept.last().unwrap().reason, "damage 4");
    }
}
