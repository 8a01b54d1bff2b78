//! Where an active task's records land in its changelog partition, known without a delivery
//! report per record.
//!
//! The store records, in the same batch as the data, the changelog offset it reflects: a
//! restore replays from there. That offset must never be *past* a record the store has not
//! applied (the record would be skipped), while one a little *before* the truth only replays
//! records the store already holds, which changes nothing (a put keeps the later time; the
//! changelog is a log of puts). So a lower bound is safe, and counting gives one: the task's
//! own producer writes its records after the end of the changelog as the store last saw it
//! (the end a restore read up to, or our previous transaction's commit marker, which comes
//! after that transaction's records), so `n` records of a transaction take offsets `first ..`
//! at the earliest `first + n - 1`, and its commit marker comes after them. Anything else
//! written there in between (an aborted transaction of ours, a fenced zombie's) only moves the
//! true offsets further, never ours below the count.

/// The changelog offsets an active task's commits give its store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangelogPosition {
    /// What our last commit gave the store, and where our next records land at the earliest
    /// (after that commit's marker).
    last_commit: Option<(i64, i64)>,
}

impl ChangelogPosition {
    /// The changelog offset a store holding `store_offset` reflects once a transaction that
    /// sent `records` records to the task's changelog partition has committed: the offset of
    /// its commit marker at the earliest (the store reflects everything before it). `None`
    /// when the transaction sent nothing there (the store's offset does not change).
    pub fn committed(&mut self, store_offset: Option<i64>, records: i64) -> Option<i64> {
        if records <= 0 {
            return None;
        }
        let first = match self.last_commit {
            // The store holds what our last commit gave it: our records came after that
            // commit's marker.
            Some((given, next)) if store_offset == Some(given) => next,
            // A store opened or restored since: its offset is where its reader stopped, the
            // end of the changelog then, and everything we write comes after it.
            _ => store_offset.unwrap_or(0),
        };
        let marker = first + records;
        self.last_commit = Some((marker, marker + 1));
        Some(marker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_store_counts_from_where_its_reader_stopped() {
        let mut p = ChangelogPosition::default();
        // Restored up to 100 (the end then): 3 records take 100, 101, 102; the marker 103.
        assert_eq!(p.committed(Some(100), 3), Some(103));
    }

    #[test]
    fn the_next_transaction_counts_past_the_previous_commit_marker() {
        let mut p = ChangelogPosition::default();
        assert_eq!(p.committed(Some(100), 3), Some(103));
        // The store now holds 103; the marker took 103, so 2 records take 104 and 105.
        assert_eq!(p.committed(Some(103), 2), Some(106));
        assert_eq!(p.committed(Some(106), 1), Some(108));
    }

    #[test]
    fn a_transaction_without_changelog_records_leaves_the_offset_alone() {
        let mut p = ChangelogPosition::default();
        assert_eq!(p.committed(Some(100), 3), Some(103));
        assert_eq!(p.committed(Some(103), 0), None);
        // Still counted from the last commit that wrote there.
        assert_eq!(p.committed(Some(103), 1), Some(105));
    }

    #[test]
    fn a_store_restored_since_the_last_commit_counts_from_its_own_offset() {
        let mut p = ChangelogPosition::default();
        assert_eq!(p.committed(Some(100), 3), Some(103));
        // An abort made the store catch up from the changelog, to 110.
        assert_eq!(p.committed(Some(110), 2), Some(112));
    }

    #[test]
    fn a_store_without_an_offset_counts_from_the_start() {
        let mut p = ChangelogPosition::default();
        assert_eq!(p.committed(None, 2), Some(2));
    }

    #[test]
    fn the_count_never_passes_the_true_offsets_when_others_write_in_between() {
        // The true log: the store was restored to 10; our first transaction writes 3 records
        // (10, 11, 12) and its marker (13); an aborted transaction of ours then takes 14..=16
        // and its marker 17; the next committed one writes 2 records (18, 19), marker 20.
        let mut p = ChangelogPosition::default();
        let first = p.committed(Some(10), 3).unwrap();
        assert!(first <= 13, "{first}");
        let second = p.committed(Some(first), 2).unwrap();
        assert!(second <= 20, "{second}");
    }
}
