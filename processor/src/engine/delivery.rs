//! The producer's delivery reports: which changelog offsets the open transaction's store
//! records got (the store records them with the data), and which records Kafka refused, with
//! the input record each came from so a failure is charged to the record that caused it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

use super::send_now::send_lingering_for;

/// The consumed record a produced record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub stage: super::Stage,
    pub partition: i32,
    pub offset: i64,
}

/// A record Kafka did not take.
#[derive(Clone, Debug)]
pub struct ProduceError {
    pub topic: String,
    pub code: Option<RDKafkaErrorCode>,
    pub message: String,
    pub origin: Option<Origin>,
}

/// Producer callbacks.
#[derive(Default)]
pub struct DeliveryTracker {
    changelog_topic: String,
    /// Changelog partition → highest offset delivered in the open transaction.
    changelog_offsets: Mutex<HashMap<i32, i64>>,
    failures: Mutex<Vec<ProduceError>>,
}

impl DeliveryTracker {
    pub fn new(changelog_topic: &str) -> Self {
        DeliveryTracker {
            changelog_topic: changelog_topic.to_string(),
            ..Default::default()
        }
    }

    pub fn take_offsets(&self) -> HashMap<i32, i64> {
        std::mem::take(&mut self.changelog_offsets.lock().unwrap())
    }

    pub fn take_failures(&self) -> Vec<ProduceError> {
        std::mem::take(&mut self.failures.lock().unwrap())
    }

    pub fn clear(&self) {
        self.changelog_offsets.lock().unwrap().clear();
        self.failures.lock().unwrap().clear();
    }
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = Box<Origin>;

    fn delivery(&self, result: &DeliveryResult<'_>, origin: Box<Origin>) {
        match result {
            Ok(m) if m.topic() == self.changelog_topic => {
                let mut offsets = self.changelog_offsets.lock().unwrap();
                let e = offsets.entry(m.partition()).or_insert(m.offset());
                *e = (*e).max(m.offset());
            }
            Ok(_) => {}
            Err((e, m)) => self.failures.lock().unwrap().push(ProduceError {
                topic: m.topic().to_string(),
                code: e.rdkafka_error_code(),
                message: format!("delivery to {} failed: {e}", m.topic()),
                origin: Some(*origin),
            }),
        }
    }
}

/// How long [`await_deliveries`] waits, letting lingering batches go, when no delivery report
/// was waiting (librdkafka counts this wait in whole milliseconds).
const DELIVERY_WAIT_SLICE: Duration = Duration::from_millis(1);

/// Serves delivery reports until no record is in flight, or `timeout` passes.
///
/// rust-rdkafka's `commit_transaction` flushes first, and its flush polls in slices of 100 ms
/// that run to their end even when the last delivery report arrives a millisecond in: every
/// commit took at least 100 ms, which was most of the end-to-end latency. Waiting here first
/// leaves that flush nothing to wait for.
///
/// It does not wait inside `poll(t)`: that serves events until `t` has passed and asks
/// librdkafka's queue for the rest in whole milliseconds, so after a slice's first event it
/// spins (with `poll(1 ms)` slices, 9% of the processing thread's time went to the clock reads
/// of that spin). Instead: one event at a time (`poll(0)` takes at most one) while they come,
/// and a short wait when none was waiting, during which librdkafka sends what it holds back
/// for `linger.ms` ([`super::send_now`]: a commit does not wait out the linger).
pub fn await_deliveries<C: ProducerContext>(producer: &BaseProducer<C>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut in_flight = producer.in_flight_count();
    while in_flight > 0 {
        producer.poll(Duration::ZERO);
        let now_in_flight = producer.in_flight_count();
        if now_in_flight == in_flight {
            if Instant::now() >= deadline {
                return;
            }
            send_lingering_for(producer, DELIVERY_WAIT_SLICE);
        }
        in_flight = now_in_flight;
    }
}
