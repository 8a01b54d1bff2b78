//! Sending what a producer holds back for `linger.ms`, now: the engine's one librdkafka call
//! that rust-rdkafka does not offer in a usable form, and one of the three modules with `unsafe`
//! code (with `group/txn_offsets.rs` and `restore/record_batches.rs`; Cargo.toml's lint comment).
//!
//! A partial batch waits for `linger.ms` before librdkafka sends it, unless the application
//! is inside `rd_kafka_flush`: for as long as that call runs, a flag tells the broker threads to
//! treat the linger as over. A commit has nothing to gain from the linger (nobody can read the
//! transaction's records before it commits) and waits for every delivery, so without the flag
//! each commit waited out the linger of its last batches: up to `linger.ms` per commit, twice
//! on a record's way through the topology (its route transaction, then its dedup transaction),
//! on top of the commit interval. Kafka's Java producer, and with it Kafka Streams, skips the
//! linger when a transaction commits.
//!
//! rust-rdkafka's `flush` calls `rd_kafka_flush` with a zero timeout and then polls, so the flag
//! is down again before a broker thread has woken up to read it. The call here holds it for a
//! slice of time instead. With delivery reports as events (how rust-rdkafka asks for them)
//! librdkafka's flush does not serve them; it waits until no message is in flight, which it
//! cannot be while the reports wait to be served, so each call takes its whole slice.

#![allow(unsafe_code)]

use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

/// Lets `producer`'s broker threads send every batch they hold, lingering or not, for `slice`
/// (whole milliseconds, at least one): the calling thread blocks for that long unless no
/// message is in flight.
pub fn send_lingering_for<C: ProducerContext>(producer: &BaseProducer<C>, slice: Duration) {
    let slice_ms = slice.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: the producer handle is valid for the whole call. The result (whether messages
    // are still in flight) is not needed: the caller counts them itself.
    unsafe {
        rd::rd_kafka_flush(producer.client().native_ptr(), slice_ms);
    }
}
