//! The quarantine folder: damaged stores the processor moved aside instead of crash-looping on
//! them, each with a file saying why. The processor moves and prunes them; here is how they
//! are found again.

use std::path::{Path, PathBuf};

/// The file in a quarantined store's folder that says why it was moved aside.
pub const REASON_FILE: &str = "REASON";

/// A damaged store the processor moved aside: `<state-dir>/quarantine/<partition>-<unix ms>/`,
/// with a [`REASON_FILE`] saying why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuarantinedStore {
    pub path: PathBuf,
    pub partition: i32,
    pub at_ms: i64,
    pub reason: String,
}

/// The quarantined stores in `dir` (the state dir's `quarantine/`), oldest first. Folders not
/// named `<partition>-<ms>` are not quarantined stores and are left out; a missing reason is
/// an empty one.
pub(super) fn list(dir: &Path) -> Vec<QuarantinedStore> {
    let mut out: Vec<QuarantinedStore> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (partition, at_ms) = name.split_once('-')?;
            let reason = std::fs::read_to_string(e.path().join(REASON_FILE)).unwrap_or_default();
            Some(QuarantinedStore {
                path: e.path(),
                partition: partition.parse().ok()?,
                at_ms: at_ms.parse().ok()?,
                reason: reason.trim().to_string(),
            })
        })
        .collect();
    out.sort_by_key(|q| q.at_ms);
    out
}

#[cfg(test)]
mod tests {
    use crate::state_volume::StateDir;

    #[test]
    fn quarantines_are_listed_oldest_first_with_their_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        for (partition, at_ms, reason) in [
            (1, 2000, Some("Corruption: block checksum mismatch\n")),
            (0, 1000, Some("missing sst")),
            (2, 3000, None),
        ] {
            let q = state.quarantined_store_dir(partition, at_ms);
            std::fs::create_dir_all(&q).unwrap();
            if let Some(reason) = reason {
                std::fs::write(q.join(super::REASON_FILE), reason).unwrap();
            }
        }
        std::fs::create_dir_all(state.quarantine_dir().join("notes")).unwrap();
        let found: Vec<_> = state
            .quarantines()
            .into_iter()
            .map(|q| (q.partition, q.at_ms, q.reason))
            .collect();
        assert_eq!(
            found,
            vec![
                (0, 1000, "missing sst".to_string()),
                (1, 2000, "Corruption: block checksum mismatch".to_string()),
                (2, 3000, String::new()),
            ]
        );
        assert!(
            StateDir::new(dir.path().join("none"), None)
                .quarantines()
                .is_empty()
        );
    }
}
