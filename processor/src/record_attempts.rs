//! Records that fail every time they are tried (a poison pill in a later stage, a value the
//! topic refuses) must not stop their partition: a failed record aborts its transaction and
//! is processed again, and without a bound that is forever.
//!
//! The policy, like Kafka Streams' processing exception handler (KIP-1033) after a bounded
//! retry:
//! - a record that failed is processed again **alone**, in a transaction of its own, so each
//!   further failure costs only its own work, not that of every record around it;
//! - after `max_attempts` failed attempts the record goes to the dead-letter topic with the
//!   error of its last attempt, and the partition goes on.
//!
//! Failures that are no record's fault (a broker away, a timeout) are not counted: they are
//! retried without limit. Counts live in memory: a restarted process counts again, so the
//! bound is per process life.

use std::collections::BTreeMap;

/// Which kind of failure a record had, also the dead letter's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// A stage of the topology failed on it.
    Processing,
    /// Kafka refused one of its records (too large, invalid).
    Produce,
}

impl FailureKind {
    /// The `streamapp.dlq.reason` of the dead letter.
    pub fn reason(self) -> &'static str {
        match self {
            FailureKind::Processing => "processing-failed",
            FailureKind::Produce => "produce-failed",
        }
    }
}

/// A record's failed attempts so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failures {
    pub attempts: u32,
    pub kind: FailureKind,
    /// The error of the last attempt.
    pub error: String,
    /// The last attempt failed because the record is too large: its dead letter carries
    /// metadata only.
    pub too_large: bool,
}

/// What to do with a record before processing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Never failed: process it with the others.
    Process,
    /// Failed before: commit what is open first, then process it in a transaction of its own.
    ProcessAlone,
    /// Failed `max_attempts` times: send it to the dead-letter topic instead.
    DeadLetter(Failures),
}

/// Failed attempts per record (partition, offset).
#[derive(Clone, Debug)]
pub struct RecordAttempts {
    max_attempts: u32,
    failed: BTreeMap<(i32, i64), Failures>,
}

impl RecordAttempts {
    pub fn new(max_attempts: u32) -> Self {
        RecordAttempts {
            max_attempts: max_attempts.max(1),
            failed: BTreeMap::new(),
        }
    }

    pub fn verdict(&self, partition: i32, offset: i64) -> Verdict {
        match self.failed.get(&(partition, offset)) {
            None => Verdict::Process,
            Some(f) if f.attempts >= self.max_attempts => Verdict::DeadLetter(f.clone()),
            Some(_) => Verdict::ProcessAlone,
        }
    }

    /// Counts a failed attempt; returns how many there were.
    pub fn failed(
        &mut self,
        partition: i32,
        offset: i64,
        kind: FailureKind,
        error: String,
        too_large: bool,
    ) -> u32 {
        let f = self.failed.entry((partition, offset)).or_insert(Failures {
            attempts: 0,
            kind,
            error: String::new(),
            too_large: false,
        });
        f.attempts += 1;
        f.kind = kind;
        f.error = error;
        f.too_large = too_large;
        f.attempts
    }

    /// Everything before `position` on `partition` is committed: those records are settled.
    pub fn committed(&mut self, partition: i32, position: i64) {
        self.failed
            .retain(|&(p, o), _| p != partition || o >= position);
    }

    /// The partition is not ours any more; its next owner counts on its own.
    pub fn forget_partition(&mut self, partition: i32) {
        self.failed.retain(|&(p, _), _| p != partition);
    }

    pub fn len(&self) -> usize {
        self.failed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.failed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_keeps_failing_is_isolated_then_dead_lettered_after_the_last_attempt() {
        let mut a = RecordAttempts::new(3);
        assert_eq!(a.verdict(0, 7), Verdict::Process);
        for attempt in 1..=2 {
            a.failed(
                0,
                7,
                FailureKind::Processing,
                format!("boom {attempt}"),
                false,
            );
            assert_eq!(a.verdict(0, 7), Verdict::ProcessAlone);
        }
        a.failed(0, 7, FailureKind::Processing, "boom 3".into(), false);
        let Verdict::DeadLetter(f) = a.verdict(0, 7) else {
            panic!("dead-lettered after 3 attempts")
        };
        assert_eq!((f.attempts, f.error.as_str()), (3, "boom 3"));
        assert_eq!(f.kind.reason(), "processing-failed");
        assert_eq!(
            a.verdict(0, 8),
            Verdict::Process,
            "its neighbours are not affected"
        );
        assert_eq!(a.verdict(1, 7), Verdict::Process);
    }

    #[test]
    fn one_attempt_dead_letters_at_once_after_the_first_failure() {
        let mut a = RecordAttempts::new(1);
        a.failed(2, 0, FailureKind::Produce, "too large".into(), true);
        assert!(matches!(a.verdict(2, 0), Verdict::DeadLetter(f) if f.too_large));
    }

    #[test]
    fn committed_records_and_revoked_partitions_are_forgotten() {
        let mut a = RecordAttempts::new(3);
        a.failed(0, 5, FailureKind::Processing, "x".into(), false);
        a.failed(0, 9, FailureKind::Processing, "x".into(), false);
        a.failed(1, 5, FailureKind::Processing, "x".into(), false);
        a.committed(0, 6);
        assert_eq!(a.verdict(0, 5), Verdict::Process);
        assert_eq!(a.verdict(0, 9), Verdict::ProcessAlone);
        a.forget_partition(1);
        assert_eq!(a.verdict(1, 5), Verdict::Process);
        assert_eq!(a.len(), 1);
    }
}
