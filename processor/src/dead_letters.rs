//! The dead-letter listing (`GET /dead-letters`, defined in [`streamapp_api::dead_letters`]):
//! the latest dead letters of this app, read from its dead-letter topic with read_committed.
//!
//! A short-lived consumer per request that is assigned the partitions (it joins no group and
//! commits nothing: nothing is left behind in Kafka), starts at the query's time, and reads to
//! the end of each partition within a time and record budget, keeping only the latest matches.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use streamapp_api::dead_letters::{DeadLetter, Listing, Query, value_prefix};

use crate::topology::{
    DLQ_ERROR_HEADER, DLQ_ORIGINAL_SIZE_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER,
};

/// How long one listing may read.
const TIME_BUDGET: Duration = Duration::from_secs(10);
/// Dead letters one listing reads at most (matching or not).
const RECORD_BUDGET: u64 = 200_000;

/// Where the dead letters are, known once the topics are checked.
#[derive(Clone)]
pub struct Settings {
    pub pod: String,
    pub client: ClientConfig,
    pub topic: String,
}

/// Lists what `query` asks for.
pub fn list(settings: &Settings, query: &Query) -> Result<Listing, String> {
    let kafka = |what: &str, e: KafkaError| format!("{what} of {}: {e}", settings.topic);
    let consumer: BaseConsumer = settings
        .client
        .clone()
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // Required by librdkafka for a consumer; never used: no subscribe, no commit.
        .set("group.id", "streamapp-dead-letters-unused")
        .create()
        .map_err(|e| kafka("a reader", e))?;
    let metadata = consumer
        .fetch_metadata(Some(&settings.topic), Duration::from_secs(10))
        .map_err(|e| kafka("the metadata", e))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == settings.topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(format!(
            "the dead-letter topic {} does not exist",
            settings.topic
        ));
    }
    let mut start = TopicPartitionList::new();
    for &p in &partitions {
        let at = match query.since_ms {
            Some(t) => Offset::Offset(t),
            None => Offset::Beginning,
        };
        start
            .add_partition_offset(&settings.topic, p, at)
            .map_err(|e| kafka("the start", e))?;
    }
    if query.since_ms.is_some() {
        start = consumer
            .offsets_for_times(start, Duration::from_secs(10))
            .map_err(|e| kafka("the offsets at the time asked", e))?;
    }
    // A partition with nothing at or after the time asked, or nothing at all, is done.
    let mut reading = BTreeSet::new();
    for e in start.elements() {
        let (low, high) = consumer
            .fetch_watermarks(&settings.topic, e.partition(), Duration::from_secs(10))
            .map_err(|err| kafka("the watermarks", err))?;
        if e.offset() != Offset::End && high > low {
            reading.insert(e.partition());
        }
    }
    consumer
        .assign(&start)
        .map_err(|e| kafka("assigning the partitions", e))?;
    let deadline = Instant::now() + TIME_BUDGET;
    let (mut scanned, mut matches) = (0u64, Vec::new());
    while !reading.is_empty() && scanned < RECORD_BUDGET && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                reading.remove(&p);
            }
            Some(Err(e)) => return Err(kafka("reading", e)),
            Some(Ok(m)) => {
                scanned += 1;
                let dead_letter = describe(&m);
                if query
                    .reason
                    .as_ref()
                    .is_none_or(|r| dead_letter.reason.as_ref() == Some(r))
                {
                    matches.push(dead_letter);
                    if matches.len() >= 2 * query.limit {
                        keep_latest(&mut matches, query.limit);
                    }
                }
            }
        }
    }
    keep_latest(&mut matches, query.limit);
    Ok(Listing {
        topic: settings.topic.clone(),
        pod: settings.pod.clone(),
        scanned,
        complete: reading.is_empty(),
        dead_letters: matches,
    })
}

/// Keeps the latest `limit` by time (then partition and offset), oldest first.
fn keep_latest(matches: &mut Vec<DeadLetter>, limit: usize) {
    matches.sort_by_key(|d| (d.time, d.partition, d.offset));
    let excess = matches.len().saturating_sub(limit);
    matches.drain(..excess);
}

fn describe(m: &rdkafka::message::BorrowedMessage<'_>) -> DeadLetter {
    let header = |name: &str| {
        m.headers()?
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let value = m.payload().unwrap_or_default();
    let original_size = header(DLQ_ORIGINAL_SIZE_HEADER).and_then(|s| s.parse().ok());
    DeadLetter {
        partition: m.partition(),
        offset: m.offset(),
        time: m.timestamp().to_millis().unwrap_or_default(),
        reason: header(DLQ_REASON_HEADER),
        source: header(DLQ_SOURCE_HEADER),
        error: header(DLQ_ERROR_HEADER),
        size: original_size.unwrap_or(value.len() as u64),
        value_prefix: m.payload().map(value_prefix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time: i64, offset: i64) -> DeadLetter {
        DeadLetter {
            partition: 0,
            offset,
            time,
            reason: None,
            source: None,
            error: None,
            size: 0,
            value_prefix: None,
        }
    }

    #[test]
    fn the_latest_are_kept_oldest_first() {
        let mut matches = vec![at(5, 0), at(1, 1), at(9, 2), at(3, 3)];
        keep_latest(&mut matches, 2);
        assert_eq!(matches, [at(5, 0), at(9, 2)]);
    }
}
