//! Moving damaged stores aside instead of crash-looping on them.
//!
//! A damaged store (see [`crate::store::Fault`]) is renamed into
//! `<state-dir>/quarantine/<partition>-<unix-ms>/` with a `REASON` file (the layout:
//! [`streamapp_api::state_volume`]), and the task rebuilds its store from the changelog.
//!
//! Quarantined copies are pruned to the newest [`KEEP`], but only once a healthy store exists
//! again, and never the newest copy of a partition that has no healthy store: until the
//! rebuild succeeded, that copy may be the only one holding the ids. The task lifecycle stops
//! quarantining a partition whose rebuilds keep failing (see
//! [`crate::lifecycle::MAX_REBUILDS_IN_A_ROW`]), so the folder stays bounded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use streamapp_api::health::Quarantine;
use streamapp_api::state_volume::{
    QuarantinedStore, REASON_FILE, StateDir, remove_if_present, write_atomically,
};

/// Quarantined stores kept per state dir.
pub const KEEP: usize = 3;

/// The file in a quarantine folder that says a move into it is not finished: it holds the
/// partition. A crash at any step of [`quarantine`] leaves it, and the next start finishes the
/// move ([`finish_interrupted`]) before any store is opened.
const MOVING: &str = "MOVING";

/// Moves the task's store (and its separate WAL dir, if any) into quarantine.
///
/// Safe against a crash at any step: the plan is written first, then the WAL goes (RocksDB
/// refuses to create a store beside WAL files left in its WAL dir, so the rebuilt store would
/// be taken for damaged and quarantined in turn), then the store, then the checkpoint; each
/// step can be done again.
pub fn quarantine(
    state: &StateDir,
    partition: i32,
    reason: &str,
    now_ms: i64,
) -> std::io::Result<Quarantine> {
    let target = plan(state, partition, reason, now_ms)?;
    for step in Step::ALL {
        step.run(state, partition, &target)?;
    }
    Ok(Quarantine {
        at_ms: now_ms,
        reason: reason.into(),
        path: target.display().to_string(),
    })
}

/// The quarantine folder of the move, with the plan and the reason written.
fn plan(state: &StateDir, partition: i32, reason: &str, now_ms: i64) -> std::io::Result<PathBuf> {
    let target = state.quarantined_store_dir(partition, now_ms);
    std::fs::create_dir_all(&target)?;
    write_atomically(&target.join(MOVING), partition.to_string().as_bytes())?;
    std::fs::write(target.join(REASON_FILE), reason)?;
    Ok(target)
}

/// Finishes the moves into quarantine that a crash interrupted; returns their folders. Run at
/// start-up, before any store is opened.
pub fn finish_interrupted(state: &StateDir) -> std::io::Result<Vec<PathBuf>> {
    let mut finished = Vec::new();
    let Ok(entries) = std::fs::read_dir(state.quarantine_dir()) else {
        return Ok(finished); // no quarantine yet
    };
    for entry in entries {
        let target = entry?.path();
        let Ok(plan) = std::fs::read_to_string(target.join(MOVING)) else {
            continue;
        };
        let partition: i32 = plan.trim().parse().map_err(|_| {
            std::io::Error::other(format!(
                "{}: {MOVING} does not name a partition: {plan:?}",
                target.display()
            ))
        })?;
        for step in Step::ALL {
            step.run(state, partition, &target)?;
        }
        finished.push(target);
    }
    Ok(finished)
}

/// The steps of a move into quarantine, in order; each one is a no-op once done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The separate WAL dir, if any: renamed, or (another filesystem) copied to `wal.partial`,
    /// renamed to `wal` once complete, then removed.
    Wal,
    Store,
    /// A checkpoint must not vouch for the store that replaces this one.
    Checkpoint,
    /// The plan is removed: the move is done.
    Done,
}

impl Step {
    const ALL: [Step; 4] = [Step::Wal, Step::Store, Step::Checkpoint, Step::Done];

    fn run(self, state: &StateDir, partition: i32, target: &Path) -> std::io::Result<()> {
        match self {
            Step::Wal => {
                let Some(wal) = state.wal_dir(partition).filter(|w| w.exists()) else {
                    return Ok(());
                };
                let (done, partial) = (target.join("wal"), target.join("wal.partial"));
                if partial.exists() {
                    std::fs::remove_dir_all(&partial)?; // a copy a crash cut short
                }
                if !done.exists() && std::fs::rename(&wal, &done).is_err() {
                    copy_dir(&wal, &partial)?;
                    std::fs::rename(&partial, &done)?;
                }
                if wal.exists() {
                    std::fs::remove_dir_all(&wal)?;
                }
                Ok(())
            }
            Step::Store => {
                let store = state.store_dir(partition);
                if store.exists() {
                    std::fs::rename(&store, target.join("store"))?;
                }
                Ok(())
            }
            Step::Checkpoint => remove_if_present(&state.checkpoint_file(partition)),
            Step::Done => remove_if_present(&target.join(MOVING)),
        }
    }
}

/// Deletes old quarantined copies: see [`to_prune`]. `unhealthy` are the partitions without a
/// healthy store in this process.
pub fn prune(state: &StateDir, keep: usize, unhealthy: &BTreeSet<i32>) -> std::io::Result<()> {
    let all = state.quarantines();
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

    /// A task store with a separate WAL dir, holding `id` in its WAL only (not flushed).
    fn store_with_unflushed(state: &StateDir, id: &[u8]) {
        let mut store = open_store(state);
        let mut staged = crate::store::Staged::default();
        staged.put(id, crate::shared::now_ms());
        store.apply(&staged).unwrap();
        let wal = state.wal_dir(0).unwrap();
        assert!(
            streamapp_api::state_volume::wal_files(&wal).files > 0,
            "the write is in a WAL file of {}",
            wal.display()
        );
    }

    fn open_store(state: &StateDir) -> crate::store::TaskStore {
        try_open_store(state).unwrap()
    }

    fn try_open_store(state: &StateDir) -> crate::store::Result<crate::store::TaskStore> {
        use streamapp_api::config::{ResolvedRocksDb, RocksDbProfile};
        let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
        crate::store::TaskStore::open(
            &state.store_dir(0),
            state.wal_dir(0).as_deref(),
            &tuning,
            &crate::store::SharedMemory::new(&tuning, true),
            crate::store::MemoryRole::Active,
            crate::store::Window {
                retention: std::time::Duration::from_secs(3600),
                max_skew: std::time::Duration::from_secs(60),
            },
            &crate::store::ChangelogIdentity {
                topic: "changelog".into(),
                partition: 0,
                topic_id: None,
            },
        )
    }

    #[test]
    fn a_store_cannot_be_created_beside_a_left_over_wal_which_is_why_the_wal_moves_first() {
        let (dir, wal) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let state = StateDir::new(dir.path(), Some(wal.path().to_path_buf()));
        store_with_unflushed(&state, b"damaged");
        // The old order, interrupted: the store moved, its WAL left behind.
        let target = plan(&state, 0, "damage", 1).unwrap();
        Step::Store.run(&state, 0, &target).unwrap();
        let refused = try_open_store(&state)
            .err()
            .expect("RocksDB refuses to create a store beside the old WAL");
        // Taken for damage, the empty rebuilt store would be quarantined in turn.
        assert_eq!(refused.fault(), crate::store::Fault::Damaged, "{refused}");
        assert!(
            refused
                .reason()
                .contains("wal_dir contains existing log file"),
            "{refused}"
        );
    }

    #[test]
    fn a_crash_at_any_step_of_a_quarantine_with_a_wal_dir_is_finished_at_the_next_start() {
        for done in 0..=Step::ALL.len() {
            let (dir, wal) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let state = StateDir::new(dir.path(), Some(wal.path().to_path_buf()));
            store_with_unflushed(&state, b"damaged");
            std::fs::write(state.checkpoint_file(0), "0\n0\n").unwrap();
            // The move, up to a crash after `done` steps.
            let target = plan(&state, 0, "damage", 1).unwrap();
            for step in &Step::ALL[..done] {
                step.run(&state, 0, &target).unwrap();
            }
            // The next start.
            let finished = finish_interrupted(&state).unwrap();
            assert_eq!(
                finished.len(),
                usize::from(done < Step::ALL.len()),
                "after {done} steps"
            );
            assert!(target.join("store/CURRENT").exists(), "after {done} steps");
            assert!(target.join("wal").exists(), "after {done} steps");
            assert!(!target.join("wal.partial").exists());
            assert!(!target.join(MOVING).exists());
            assert!(!state.checkpoint_file(0).exists());
            let rebuilt = open_store(&state);
            assert_eq!(
                rebuilt.first_seen(b"damaged").unwrap(),
                None,
                "after {done} steps the rebuilt store holds only what the changelog gives it"
            );
        }
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
        assert_eq!(state.quarantines().len(), 5, "quarantining never deletes");
        prune(&state, KEEP, &BTreeSet::new()).unwrap();
        let kept = state.quarantines();
        assert_eq!(kept.len(), KEEP);
        assert_eq!(kept.last().unwrap().reason, "damage 4");
    }
}
