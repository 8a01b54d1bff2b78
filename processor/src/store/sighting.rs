//! What the store (and its changelog) says about one id: when it was first seen and, since
//! store format 2, where that first occurrence came from.
//!
//! The same bytes are a store value (`i/<id>`) and a changelog record's value, so a store
//! rebuilt from the changelog answers a lookup as the one that wrote it:
//!
//! ```text
//! time (i64, big endian) [ partition (i32, BE) | offset (i64, BE) | topic (UTF-8, the rest) ]
//! ```
//!
//! Eight bytes alone are a sighting whose source is unknown: what format 1 stores and older
//! processors' changelog records hold.

use std::sync::Arc;

/// Bytes of the time, and of the time with a source's partition and offset.
const TIME_LEN: usize = 8;
const FIXED_LEN: usize = TIME_LEN + 4 + 8;
/// Kafka's longest topic name.
const MAX_TOPIC: usize = 249;
/// The longest encoded sighting: it always fits on the stack.
pub const MAX_ENCODED: usize = FIXED_LEN + MAX_TOPIC;

/// The input record an id was first seen in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
}

/// An id's first sighting: the record time the store keeps, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub time: i64,
    pub source: Option<Source>,
}

impl Sighting {
    /// Whether this sighting replaces `held` as the one kept for their id: the later time
    /// wins, and of two at the same time the first (whatever batches they came in).
    pub fn supersedes(&self, held: &Sighting) -> bool {
        self.time > held.time
    }

    /// A sighting whose source is not known (a format 1 store, an older changelog record).
    pub fn at(time: i64) -> Self {
        Sighting { time, source: None }
    }

    /// Writes the sighting into `buf`; returns how many bytes it took. A topic name longer
    /// than Kafka allows (it cannot come from Kafka) is written without its source.
    pub fn encode(&self, buf: &mut [u8; MAX_ENCODED]) -> usize {
        buf[..TIME_LEN].copy_from_slice(&self.time.to_be_bytes());
        let Some(source) = self.source.as_ref().filter(|s| s.topic.len() <= MAX_TOPIC) else {
            return TIME_LEN;
        };
        buf[TIME_LEN..TIME_LEN + 4].copy_from_slice(&source.partition.to_be_bytes());
        buf[TIME_LEN + 4..FIXED_LEN].copy_from_slice(&source.offset.to_be_bytes());
        let end = FIXED_LEN + source.topic.len();
        buf[FIXED_LEN..end].copy_from_slice(source.topic.as_bytes());
        end
    }

    /// The encoded bytes, allocated (for tests and the rare write outside the hot path).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut buf = [0u8; MAX_ENCODED];
        let len = self.encode(&mut buf);
        buf[..len].to_vec()
    }

    /// Reads a sighting; `None` for bytes no processor wrote. `known_topic`: a topic the
    /// caller shares already (the input topic), so decoding it allocates nothing.
    pub fn decode(bytes: &[u8], known_topic: Option<&Arc<str>>) -> Option<Self> {
        let time = time_of(bytes)?;
        if bytes.len() == TIME_LEN {
            return Some(Sighting::at(time));
        }
        if bytes.len() <= FIXED_LEN {
            return None;
        }
        let partition = i32::from_be_bytes(bytes[TIME_LEN..TIME_LEN + 4].try_into().ok()?);
        let offset = i64::from_be_bytes(bytes[TIME_LEN + 4..FIXED_LEN].try_into().ok()?);
        // Most sources name the topic known already: compared as bytes, it need not be
        // checked as UTF-8 or allocated again.
        let topic = &bytes[FIXED_LEN..];
        let topic = match known_topic {
            Some(known) if known.as_bytes() == topic => known.clone(),
            _ => Arc::from(std::str::from_utf8(topic).ok()?),
        };
        Some(Sighting {
            time,
            source: Some(Source {
                topic,
                partition,
                offset,
            }),
        })
    }
}

/// The time of an encoded sighting, without reading the rest (every lookup's question).
pub fn time_of(bytes: &[u8]) -> Option<i64> {
    let time: [u8; TIME_LEN] = bytes.get(..TIME_LEN)?.try_into().ok()?;
    Some(i64::from_be_bytes(time))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(topic: &str) -> Source {
        Source {
            topic: Arc::from(topic),
            partition: 7,
            offset: 1 << 40,
        }
    }

    #[test]
    fn a_sighting_reads_back_as_written_with_or_without_its_source() {
        for sighting in [
            Sighting::at(-5),
            Sighting {
                time: 1_750_000_000_123,
                source: Some(source("orders")),
            },
            Sighting {
                time: 0,
                source: Some(source(&"t".repeat(MAX_TOPIC))),
            },
        ] {
            let bytes = sighting.to_vec();
            assert_eq!(Sighting::decode(&bytes, None), Some(sighting.clone()));
            assert_eq!(time_of(&bytes), Some(sighting.time));
        }
    }

    #[test]
    fn a_format_1_value_is_a_sighting_whose_source_is_unknown() {
        let bytes = 42i64.to_be_bytes();
        assert_eq!(Sighting::decode(&bytes, None), Some(Sighting::at(42)));
    }

    #[test]
    fn bytes_no_processor_wrote_are_not_a_sighting() {
        let mut not_utf8 = Sighting {
            time: 1,
            source: Some(source("ab")),
        }
        .to_vec();
        *not_utf8.last_mut().unwrap() = 0xff;
        for bytes in [
            &b""[..],
            b"1234567",
            &[0u8; 12],
            &[0u8; FIXED_LEN],
            &not_utf8,
        ] {
            assert_eq!(Sighting::decode(bytes, None), None, "{bytes:?}");
        }
    }

    #[test]
    fn the_shared_topic_is_reused_and_another_is_read_as_written() {
        let input: Arc<str> = Arc::from("orders");
        let bytes = Sighting {
            time: 1,
            source: Some(source("orders")),
        }
        .to_vec();
        let read = Sighting::decode(&bytes, Some(&input)).unwrap();
        assert!(Arc::ptr_eq(&read.source.unwrap().topic, &input));
        let other = Sighting {
            time: 1,
            source: Some(source("payments")),
        }
        .to_vec();
        let read = Sighting::decode(&other, Some(&input)).unwrap();
        assert_eq!(&*read.source.unwrap().topic, "payments");
    }

    #[test]
    fn a_topic_longer_than_kafka_allows_is_written_without_its_source() {
        let sighting = Sighting {
            time: 3,
            source: Some(source(&"t".repeat(MAX_TOPIC + 1))),
        };
        assert_eq!(
            Sighting::decode(&sighting.to_vec(), None),
            Some(Sighting::at(3))
        );
    }
}
