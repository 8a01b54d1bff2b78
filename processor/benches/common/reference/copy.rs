//! The plain transactional copy: one consume and one produce per record, no store.

use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseProducer, BaseRecord};

use super::{Reference, run_transactions};
use crate::common::System;

/// Starts the copy of `input` to `output` for the application `group`.
pub fn start_copy(
    work: &std::path::Path,
    group: &str,
    input: &str,
    output: &str,
    linger_ms: u32,
) -> System {
    super::start(Reference::Copy, work, group, input, linger_ms, &[output])
}

/// `copy <input> <linger.ms> <output> <group> <ready file>`: copies `input` to `output`
/// exactly once until stdin closes.
pub fn run(args: &[String]) {
    let [input, linger_ms, output, group, ready] = args else {
        panic!("usage: <bench> copy <input> <linger.ms> <output> <group> <ready file>");
    };
    run_transactions(group, &[input], ready, linger_ms, |producer, m| {
        send_copy(producer, output, m)
    });
}

fn send_copy(producer: &BaseProducer, output: &str, m: &BorrowedMessage<'_>) {
    let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
    if let Some(k) = m.key() {
        record = record.key(k);
    }
    if let Some(v) = m.payload() {
        record = record.payload(v);
    }
    testbed::kafka::send(producer, record);
}
