//! The skeleton of the dedup topology: what `streamapp-processor` asks of Kafka for each
//! record, and nothing more. With a repartition topic, an input record is routed (its id found
//! at `/id` in its JSON value, as the benchmark's processor is configured; written keyed by
//! the id to the id's partition, with the original key and the source in headers); a record of
//! the repartition topic (or of the input, without one) is a duplicate or a first occurrence:
//! a duplicate goes to the duplicates topic, a first occurrence to the changelog (the id and
//! an 8-byte time, on the task's partition) and to the output, each with the id in a header.
//! Everything commits in transactions of the commit interval, both topics' offsets with them.
//!
//! Where the processor keeps its store (RocksDB, the changelog's positions, expiry, staged
//! writes applied after the commit), the skeleton keeps a set of the ids' 64-bit hashes in memory
//! and never forgets one: the throughput phase repeats an id only within its retention, so the
//! answers are the processor's (a hash collision would show as a missing id in the exactly-once
//! check, never pass silently). It is the floor of the Kafka work, not a dedup to run: its
//! memory grows with the ids seen.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord};
use streamapp_api::config::{DedupId, DedupIdSource};
use streamapp_processor::repartition::{self, HEADER_PREFIX, KEY_HEADER};
use streamapp_processor::topology::{self, DEDUP_ID_HEADER, RecordView};

use super::{Reference, run_transactions};
use crate::common::System;

/// The topics of a skeleton application besides its input.
pub struct SkeletonTopics<'a> {
    /// The repartition topic, when the input is not keyed by the id.
    pub repartition: Option<&'a str>,
    /// The repartition topic's partitions (the input's).
    pub partitions: i32,
    pub changelog: &'a str,
    pub output: &'a str,
    pub duplicates: &'a str,
}

/// Starts the skeleton of the application `group` reading `input`.
pub fn start_skeleton(
    work: &std::path::Path,
    group: &str,
    input: &str,
    topics: &SkeletonTopics<'_>,
    linger_ms: u32,
) -> System {
    let partitions = topics.partitions.to_string();
    let args = [
        topics.repartition.unwrap_or("-"),
        &partitions,
        topics.changelog,
        topics.output,
        topics.duplicates,
    ];
    let mut system = super::start(Reference::Skeleton, work, group, input, linger_ms, &args);
    system.repartition = topics.repartition.map(str::to_string);
    system
}

/// `skeleton <input> <linger.ms> <repartition or -> <partitions> <changelog> <output>
/// <duplicates> <group> <ready file>`: the dedup topology's Kafka work until stdin closes.
pub fn run(args: &[String]) {
    let [
        input,
        linger_ms,
        repartition,
        partitions,
        changelog,
        output,
        duplicates,
        group,
        ready,
    ] = args
    else {
        panic!(
            "usage: <bench> skeleton <input> <linger.ms> <repartition or -> <partitions> <changelog> <output> <duplicates> <group> <ready file>"
        );
    };
    let repartition = (repartition != "-").then_some(repartition.as_str());
    let mut skeleton = Skeleton {
        input,
        repartition,
        partitions: partitions.parse().expect("a partition count"),
        changelog,
        output,
        duplicates,
        dedup_id: DedupId {
            source: DedupIdSource::JsonPointer,
            header: None,
            json_pointer: Some("/id".into()),
        },
        seen: HashSet::new(),
        hasher: RandomState::new(),
    };
    let mut topics = vec![input.as_str()];
    topics.extend(repartition);
    run_transactions(group, &topics, ready, linger_ms, |producer, m| {
        skeleton.handle(producer, m)
    });
}

struct Skeleton<'a> {
    input: &'a str,
    repartition: Option<&'a str>,
    partitions: u32,
    changelog: &'a str,
    output: &'a str,
    duplicates: &'a str,
    dedup_id: DedupId,
    /// The hashes of the ids output so far: the store's place.
    seen: HashSet<u64>,
    hasher: RandomState,
}

impl Skeleton<'_> {
    fn handle(&mut self, producer: &BaseProducer, m: &BorrowedMessage<'_>) {
        match self.repartition {
            Some(repartition) if m.topic() == self.input => self.route(producer, repartition, m),
            Some(_) => {
                let id = m.key().expect("a repartition record is keyed by its id");
                let key = header(m, KEY_HEADER);
                self.dedup(producer, m, id, key);
            }
            None => {
                let id = self.id_of(m);
                self.dedup(producer, m, &id, m.key());
            }
        }
    }

    fn id_of(&self, m: &BorrowedMessage<'_>) -> Vec<u8> {
        let find = |name: &str| header(m, name);
        let view = RecordView {
            key: m.key(),
            value: m.payload(),
            header: &find,
        };
        topology::extract_id(&view, &self.dedup_id, u64::MAX)
            .unwrap_or_else(|e| panic!("the benchmark's records have an id: {}", e.detail()))
    }

    /// The route stage's work: the record keyed by its id, on the id's partition.
    fn route(&self, producer: &BaseProducer, repartition: &str, m: &BorrowedMessage<'_>) {
        let id = self.id_of(m);
        let source = format!("{}/{}/{}", m.topic(), m.partition(), m.offset());
        let (partition, headers) =
            repartition::route(&id, m.key(), &source, kept_headers(m), self.partitions);
        let mut record = BaseRecord::<[u8], [u8]>::to(repartition)
            .key(id.as_slice())
            .partition(partition)
            .headers(headers);
        if let Some(v) = m.payload() {
            record = record.payload(v);
        }
        if let Some(t) = m.timestamp().to_millis() {
            record = record.timestamp(t);
        }
        testbed::kafka::send(producer, record);
    }

    /// The dedup stage's work: a duplicate to the duplicates topic; a first occurrence to the
    /// changelog and the output.
    fn dedup(
        &mut self,
        producer: &BaseProducer,
        m: &BorrowedMessage<'_>,
        id: &[u8],
        key: Option<&[u8]>,
    ) {
        let time = m.timestamp().to_millis().unwrap_or(0);
        let first = self.seen.insert(self.hasher.hash_one(id));
        if first {
            let kept = time.to_be_bytes();
            let changelog = BaseRecord::<[u8], [u8]>::to(self.changelog)
                .partition(m.partition())
                .key(id)
                .payload(&kept[..]);
            testbed::kafka::send(producer, changelog);
        }
        let headers = kept_headers(m).insert(Header {
            key: DEDUP_ID_HEADER,
            value: Some(id),
        });
        let topic = if first { self.output } else { self.duplicates };
        let mut record = BaseRecord::<[u8], [u8]>::to(topic)
            .headers(headers)
            .timestamp(time);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = m.payload() {
            record = record.payload(v);
        }
        testbed::kafka::send(producer, record);
    }
}

/// The value of the record's header `name`.
fn header<'a>(m: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a [u8]> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
}

/// The record's headers without the route stage's.
fn kept_headers(m: &BorrowedMessage<'_>) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            if !h.key.starts_with(HEADER_PREFIX) {
                out = out.insert(h);
            }
        }
    }
    out
}
