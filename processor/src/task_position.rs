//! Where a task stands in its input partition across transactions: the next offset to
//! process, the next one as of the last commit, and whether the open transaction moved it.
//! Tasks of both stages have one; the engine asks them for the offsets to commit
//! ([`TaskPosition::to_commit`]), tells them when the transaction committed
//! ([`TaskPosition::commit`]) or aborted ([`TaskPosition::rewind`]).

/// A task's place in its input partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskPosition {
    /// Next offset to process (the consumer position as the engine sees it); `None`: from
    /// the partition's beginning.
    next: Option<i64>,
    /// Next offset as of the last committed transaction.
    committed: Option<i64>,
    /// The open transaction processed records of this task.
    dirty: bool,
}

impl TaskPosition {
    /// A task that starts at its committed offset (`None`: nothing committed yet).
    pub fn starting_at(committed: Option<i64>) -> Self {
        TaskPosition {
            next: committed,
            committed,
            dirty: false,
        }
    }

    pub fn next(&self) -> Option<i64> {
        self.next
    }

    pub fn committed(&self) -> Option<i64> {
        self.committed
    }

    /// Whether the open transaction processed records of this task.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether the record at `offset` is the next one to process, not one fetched before a
    /// rewind (those come again, in order).
    pub fn takes(&self, offset: i64) -> bool {
        self.next.is_none_or(|next| offset >= next)
    }

    /// The record at `offset` was processed in the open transaction.
    pub fn processed(&mut self, offset: i64) {
        self.next = Some(offset + 1);
        self.dirty = true;
    }

    /// The offset to commit with the open transaction, if it processed records of this task.
    pub fn to_commit(&self) -> Option<i64> {
        self.next.filter(|_| self.dirty)
    }

    /// The open transaction committed: returns the newly committed offset, if it moved.
    pub fn commit(&mut self) -> Option<i64> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        self.committed = self.next;
        self.committed
    }

    /// The open transaction aborted: back to the committed offset. Returns whether the task
    /// had moved (and its consumer must seek back).
    pub fn rewind(&mut self) -> bool {
        if !std::mem::take(&mut self.dirty) {
            return false;
        }
        self.next = self.committed;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_task_takes_every_offset_from_where_it_starts_and_has_nothing_to_commit() {
        let fresh = TaskPosition::starting_at(None);
        assert!(fresh.takes(0));
        assert_eq!(fresh.to_commit(), None);
        let resumed = TaskPosition::starting_at(Some(10));
        assert!(
            !resumed.takes(9),
            "an offset before the committed one comes from a stale fetch"
        );
        assert!(resumed.takes(10));
        assert_eq!(resumed.to_commit(), None);
    }

    #[test]
    fn processed_records_are_committed_as_the_offset_after_the_last() {
        let mut pos = TaskPosition::starting_at(Some(10));
        pos.processed(10);
        pos.processed(11);
        assert!(
            !pos.takes(11),
            "a record already processed in this transaction"
        );
        assert_eq!(pos.to_commit(), Some(12));
        assert_eq!(pos.commit(), Some(12));
        assert_eq!(pos.committed(), Some(12));
        assert_eq!(pos.to_commit(), None, "nothing new since the commit");
        assert_eq!(pos.commit(), None, "a second commit moves nothing");
    }

    #[test]
    fn an_abort_goes_back_to_the_last_commit_and_takes_the_same_records_again() {
        let mut pos = TaskPosition::starting_at(Some(10));
        pos.processed(10);
        pos.commit();
        pos.processed(11);
        pos.processed(12);
        assert!(pos.rewind(), "the task had moved");
        assert_eq!(pos.next(), Some(11));
        assert!(pos.takes(11));
        assert_eq!(pos.to_commit(), None);
        assert!(!pos.rewind(), "nothing to rewind twice");
    }
}
