//! What a read_committed reader cannot see: records of transactions still open.
//!
//! A read_committed reader (the dedup stage, a restore, every consumer of the output) reads a
//! partition up to its *last stable offset*: the first offset of the oldest transaction still
//! open there. The partition's real end, its high watermark, is only visible to a
//! read_uncommitted reader: [`HighWatermarks`] is that probe. A reader that stands at the last
//! stable offset while the high watermark is further on waits for the transaction that starts
//! there to end ([`TransactionWait`]); one that never ends (a *hanging* transaction) holds the
//! reader until an administrator or the operator's transaction doctor aborts it
//! (`docs/operations.md`).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;

/// A consumer that only asks for watermarks, as a reader of `isolation` (`read_committed`:
/// the high watermark it gets is the last stable offset; `read_uncommitted`: the real end).
pub fn watermark_probe(base: &ClientConfig, isolation: &str) -> Result<BaseConsumer, KafkaError> {
    base.clone()
        .set("isolation.level", isolation)
        // Never joins a group: it only asks for watermarks.
        .set("group.id", "streamapp-watermarks-unused")
        .create()
}

/// Looks up the real ends (high watermarks, read_uncommitted) of one topic's partitions.
pub struct HighWatermarks {
    topic: String,
    probe: BaseConsumer,
}

impl HighWatermarks {
    pub fn new(base: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        Ok(HighWatermarks {
            topic: topic.to_string(),
            probe: watermark_probe(base, "read_uncommitted")?,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition's (low, high) watermarks: a broker round trip.
    pub fn watermarks(&self, partition: i32) -> Result<(i64, i64), KafkaError> {
        self.probe
            .fetch_watermarks(&self.topic, partition, Duration::from_secs(10))
    }

    /// The real end (high watermark) of a partition.
    pub fn end_offset(&self, partition: i32) -> Result<i64, KafkaError> {
        Ok(self.watermarks(partition)?.1)
    }
}

/// A read_committed reader held at a partition's last stable offset by a transaction open
/// there: where that transaction starts, and since when the reader has been seen there without
/// getting on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransactionWait {
    /// The last stable offset: the first offset of the open transaction.
    pub at: i64,
    /// The reader's next offset when last looked at.
    position: i64,
    since: Instant,
}

impl TransactionWait {
    /// What one look at the partition says, given the last one: the reader's next offset, the
    /// partition's last stable offset (`stable_end`, what read_committed readers see as its
    /// end) and its high watermark (`end`). `None` while nothing is open on the partition.
    ///
    /// The reader's next offset can stay a little short of the stable end for good: it is the
    /// offset after the last record it got, and commit markers (which hold no record) may
    /// follow. So a reader counts as held from the moment it stops getting on while the stable
    /// end stands: the same offsets as the last look keep that look's start.
    pub fn observe(
        previous: Option<TransactionWait>,
        position: i64,
        stable_end: i64,
        end: i64,
        now: Instant,
    ) -> Option<TransactionWait> {
        if end <= stable_end {
            return None;
        }
        let since = previous
            .filter(|w| w.at == stable_end && w.position == position)
            .map_or(now, |w| w.since);
        Some(TransactionWait {
            at: stable_end,
            position,
            since,
        })
    }

    /// The offset to report once the reader has been held there for `after`: a transaction of
    /// the processors' own is open for a commit interval, and is not worth a word.
    pub fn reported(&self, now: Instant, after: Duration) -> Option<i64> {
        (now.saturating_duration_since(self.since) >= after).then_some(self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(5);

    #[test]
    fn nothing_open_on_the_partition_is_no_wait() {
        let now = Instant::now();
        assert_eq!(TransactionWait::observe(None, 20, 20, 20, now), None);
        assert_eq!(TransactionWait::observe(None, 12, 20, 20, now), None);
    }

    #[test]
    fn a_wait_is_reported_once_the_reader_stood_at_the_same_transaction_long_enough() {
        let t0 = Instant::now();
        let first = TransactionWait::observe(None, 15, 15, 20, t0).unwrap();
        assert_eq!(first.at, 15);
        assert_eq!(
            first.reported(t0, AFTER),
            None,
            "an own commit may be on its way"
        );
        let t1 = t0 + Duration::from_secs(6);
        // More records arrived behind it: still the same transaction at 15.
        let later = TransactionWait::observe(Some(first), 15, 15, 40, t1).unwrap();
        assert_eq!(later.reported(t1, AFTER), Some(15));
    }

    #[test]
    fn a_reader_short_of_the_stable_end_by_commit_markers_is_held_once_it_stops_getting_on() {
        let t0 = Instant::now();
        // Offset 14 is the marker of the last commit: the reader's next offset stays at 14.
        let first = TransactionWait::observe(None, 14, 15, 20, t0).unwrap();
        let t1 = t0 + Duration::from_secs(6);
        let held = TransactionWait::observe(Some(first), 14, 15, 20, t1).unwrap();
        assert_eq!(held.reported(t1, AFTER), Some(15));
    }

    #[test]
    fn a_reader_that_gets_on_or_a_stable_end_that_moves_starts_the_clock_again() {
        let t0 = Instant::now();
        let first = TransactionWait::observe(None, 10, 15, 20, t0).unwrap();
        let t1 = t0 + Duration::from_secs(6);
        // It read on (committed records before the open transaction).
        let read_on = TransactionWait::observe(Some(first), 13, 15, 20, t1).unwrap();
        assert_eq!(read_on.reported(t1, AFTER), None);
        // That transaction ended, the reader moved on, and the next one holds it at 30.
        let t2 = t1 + Duration::from_secs(6);
        let next = TransactionWait::observe(Some(read_on), 30, 30, 35, t2).unwrap();
        assert_eq!(next.at, 30);
        assert_eq!(next.reported(t2, AFTER), None);
        // And once nothing is open any more, the wait is over.
        assert_eq!(TransactionWait::observe(Some(next), 35, 35, 35, t2), None);
    }
}
