//! The producer's delivery reports, of failures only (`delivery.report.only.error`): which
//! records Kafka refused, with the input record each came from so a failure is charged to the
//! record that caused it. A report per delivered record cost about a third of the processing
//! thread; the changelog offsets the store records are counted instead (see
//! `Engine::commit`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

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

/// The origins of the records sent since the open transaction began, by a number that grows
/// over the producer's life: a record's delivery opaque is its number, so that a report
/// arriving after its transaction ended finds no origin rather than another record's.
#[derive(Default)]
struct Origins {
    /// The number of `sent[0]`.
    first: usize,
    sent: Vec<Origin>,
}

/// Producer callbacks.
#[derive(Default)]
pub struct DeliveryTracker {
    origins: Mutex<Origins>,
    failures: Mutex<Vec<ProduceError>>,
}

impl DeliveryTracker {
    /// Remembers where a record about to be sent comes from; its number is the record's
    /// delivery opaque.
    pub fn track(&self, origin: Origin) -> usize {
        let mut origins = self.origins.lock().unwrap();
        origins.sent.push(origin);
        origins.first + origins.sent.len() - 1
    }

    pub fn take_failures(&self) -> Vec<ProduceError> {
        std::mem::take(&mut self.failures.lock().unwrap())
    }

    /// The transaction ended (committed or aborted): forgets its records and their failures.
    pub fn clear(&self) {
        let mut origins = self.origins.lock().unwrap();
        origins.first += origins.sent.len();
        origins.sent.clear();
        drop(origins);
        self.failures.lock().unwrap().clear();
    }
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, number: usize) {
        let Err((e, m)) = result else {
            return;
        };
        let origin = {
            let origins = self.origins.lock().unwrap();
            number
                .checked_sub(origins.first)
                .and_then(|i| origins.sent.get(i).copied())
        };
        self.failures.lock().unwrap().push(ProduceError {
            topic: m.topic().to_string(),
            code: e.rdkafka_error_code(),
            message: format!("delivery to {} failed: {e}", m.topic()),
            origin,
        });
    }
}

/// Serves delivery reports until no record is in flight, or `timeout` passes.
///
/// rust-rdkafka's `commit_transaction` flushes first, and its flush polls in slices of 100 ms
/// that run to their end even when the last delivery report arrives a millisecond in: every
/// commit took at least 100 ms, which was most of the end-to-end latency. Waiting here in 1 ms
/// slices first leaves that flush nothing to wait for.
pub fn await_deliveries<C: ProducerContext>(producer: &BaseProducer<C>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        producer.poll(Duration::from_millis(1));
    }
}
