//! The repartition stage: records re-keyed by their dedup id, so that every repeat of an id
//! reaches the task (and store) of its first occurrence whichever input partition it came on.
//!
//! With `topology.repartition: Auto` and an id that is not the record key, the topology has two
//! sub-topologies, as a Kafka Streams `selectKey` before a stateful step does:
//! 1. the **route** stage (stateless) reads the input, finds each record's id (bad records go to
//!    the dead-letter topic there) and writes it to the internal topic
//!    `<applicationId>-dedup-repartition`, keyed by the id, on the partition [`partition_for`]
//!    picks, with the original key, source and timestamp carried along ([`KEY_HEADER`],
//!    [`SOURCE_HEADER`], the record's own timestamp);
//! 2. the **dedup** stage reads the repartition topic (read_committed) and deduplicates as
//!    without repartitioning; its output carries the original key, headers and timestamp.
//!
//! Both stages' input offsets, the repartition records, the outputs and the changelog records
//! commit in the same transactions (exactly-once across the sub-topologies). What the dedup
//! stage has committed is purged from the repartition topic ([`Purger`]), as Kafka Streams
//! does, so the topic does not grow with the input.
//!
//! This module is the route stage's home: the partitioner and the header layout here, the
//! stage's tasks and what it makes of one record in [`stage`], the topic (created and
//! validated at start-up like the changelog) in [`topic`], the purger in [`purger`]. The
//! engine drives it (`engine/routing.rs`: the record's id, then the send in the transaction).

mod purger;
mod stage;
mod topic;

pub use purger::{PURGE_INTERVAL, Purger};
pub use stage::{RouteStage, route};
pub use topic::{RETENTION, RepartitionTopicError, SEGMENT_BYTES, ensure};

/// Header of a repartition record carrying the input record's key (absent value: no key).
pub const KEY_HEADER: &str = "streamapp.repartition.key";
/// Header of a repartition record carrying `topic/partition/offset` of the input record (what
/// a dead letter of the dedup stage names as its source).
pub const SOURCE_HEADER: &str = "streamapp.repartition.source";
/// Prefix of the headers the route stage adds; the dedup stage removes them again.
pub const HEADER_PREFIX: &str = "streamapp.repartition.";

/// The repartition partition of a dedup id: Kafka's default partitioner for keyed records
/// (murmur2, as the Java producer and Kafka Streams use it), so the mapping never depends on
/// the client's `partitioner` setting and an input keyed by the id with Kafka's default
/// partitioner lands on the same partition numbers.
pub fn partition_for(id: &[u8], partitions: u32) -> i32 {
    ((murmur2(id) & 0x7fff_ffff) % partitions) as i32
}

/// Kafka's `Utils.murmur2`.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, b) in rest.iter().enumerate().rev() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of Kafka's own `Utils.murmur2` and `toPositive(murmur2(key)) % 8` (kafka-clients
    /// 4.4.0), so the same id lands on the partition a Java producer would choose.
    #[test]
    fn ids_are_partitioned_like_kafkas_default_partitioner() {
        let cases: [(&str, i32, i32); 7] = [
            ("", 275_646_681, 1),
            ("a", -1_563_381_124, 4),
            ("ab", 316_155_434, 2),
            ("abc", 479_470_107, 3),
            ("abcd", -1_323_649_548, 4),
            ("cmd-000042", -1_550_143_317, 3),
            ("21", -973_932_308, 4),
        ];
        for (id, hash, partition) in cases {
            assert_eq!(murmur2(id.as_bytes()) as i32, hash, "murmur2({id:?})");
            assert_eq!(partition_for(id.as_bytes(), 8), partition, "{id:?}");
        }
    }
}
