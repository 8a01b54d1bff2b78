//! A consumed record as both stages see it, decoded once: a record of the repartition topic
//! stands for the input record it carries (its original key and source in the route stage's
//! headers, its id as its key), so the dedup stage treats it like an input record.

use std::sync::Arc;

use rdkafka::message::{BorrowedHeaders, BorrowedMessage, Header, Headers, Message, OwnedHeaders};

use super::Stage;
use super::delivery::Origin;
use crate::repartition;
use crate::store::Source;
use crate::topology;

/// A consumed record as the stages see it. A record of the repartition topic stands for the
/// input record it carries: its original key and source, its headers without the route
/// stage's own, and its id (the repartition record's key).
pub(super) struct Consumed<'a> {
    pub stage: Stage,
    pub partition: i32,
    pub offset: i64,
    /// The dedup id, when the record carries it as its key (a repartition record).
    pub id: Option<&'a [u8]>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    headers: Option<&'a BorrowedHeaders>,
    /// The record's time (the engine's wall clock when it has none).
    pub time: i64,
    topic: &'a str,
    /// `topic/partition/offset` of the input record, as a repartition record carries it.
    carried_source: Option<&'a str>,
}

impl<'a> Consumed<'a> {
    /// `topic`: the message's, read once by the caller; `wall_ms`: the engine's wall clock.
    pub fn of(
        m: &'a BorrowedMessage<'a>,
        topic: &'a str,
        stage: Stage,
        repartitioning: bool,
        wall_ms: i64,
    ) -> Self {
        let headers = m.headers();
        let repartitioned = repartitioning && stage == Stage::Dedup;
        let (id, key, carried_source) = if repartitioned {
            // The route stage's two headers, in one pass (reading a header's name costs a
            // strlen and a UTF-8 check); the first of each name counts.
            let (mut key, mut source) = (None, None);
            for h in headers.iter().flat_map(|h| h.iter()) {
                if h.key == repartition::KEY_HEADER {
                    key = key.or(Some(h.value));
                } else if h.key == repartition::SOURCE_HEADER {
                    source = source.or(Some(h.value));
                }
                if key.is_some() && source.is_some() {
                    break;
                }
            }
            (
                m.key(),
                key.flatten(),
                source.flatten().and_then(|v| std::str::from_utf8(v).ok()),
            )
        } else {
            (None, m.key(), None)
        };
        Consumed {
            stage,
            partition: m.partition(),
            offset: m.offset(),
            id,
            key,
            value: m.payload(),
            headers,
            time: m.timestamp().to_millis().unwrap_or(wall_ms),
            topic,
            carried_source,
        }
    }

    /// `topic/partition/offset` of the input record (built when asked for: a dead letter, a
    /// repartition record).
    pub fn source(&self) -> String {
        match self.carried_source {
            Some(s) => s.to_string(),
            None => format!("{}/{}/{}", self.topic, self.partition, self.offset),
        }
    }

    /// The input record as the store keeps it for a first sighting; `input_topic` is shared
    /// when the record came from it (nearly always). `None` only for a repartition record
    /// whose source header cannot be read (written by something else than a processor).
    pub fn sighting_source(&self, input_topic: &Arc<str>) -> Option<Source> {
        let (topic, partition, offset) = match self.carried_source {
            Some(s) => split_source(s)?,
            None => (self.topic, self.partition, self.offset),
        };
        Some(Source {
            topic: if topic == &**input_topic {
                input_topic.clone()
            } else {
                Arc::from(topic)
            },
            partition,
            offset,
        })
    }

    pub fn origin(&self) -> Origin {
        Origin {
            stage: self.stage,
            partition: self.partition,
            offset: self.offset,
        }
    }

    /// The value of the header `name` (the first one of that name).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers?.iter().find(|h| h.key == name)?.value
    }

    /// The record's headers, without the route stage's own. An input record that carries
    /// headers named like them (a producer's, or a record copied from a repartition topic)
    /// loses them too: the route stage's must be the only ones, or the dedup stage would take
    /// such a header for the record's original key or source.
    pub fn copy_headers(&self) -> OwnedHeaders {
        let mut out = OwnedHeaders::new();
        if let Some(h) = self.headers {
            for header in h.iter() {
                if !header.key.starts_with(repartition::HEADER_PREFIX) {
                    out = out.insert(header);
                }
            }
        }
        out
    }

    pub fn headers_with_id(&self, id: &[u8]) -> OwnedHeaders {
        self.copy_headers().insert(Header {
            key: topology::DEDUP_ID_HEADER,
            value: Some(id),
        })
    }
}

/// `topic/partition/offset` (as [`Consumed::source`] writes it) read back; a topic name may
/// not hold a `/`, but it is read from the right all the same.
fn split_source(source: &str) -> Option<(&str, i32, i64)> {
    let (rest, offset) = source.rsplit_once('/')?;
    let (topic, partition) = rest.rsplit_once('/')?;
    Some((topic, partition.parse().ok()?, offset.parse().ok()?))
}
