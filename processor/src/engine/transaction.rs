//! The transaction role: the transactional producer and the transaction it has open — begin,
//! send, commit (deliveries awaited, the offsets sent with the group's fence, the commit
//! retried while Kafka says so), abort — and what a failed transactional call means
//! ([`crate::kafka_errors::classify_txn`]). It knows nothing of stages, tasks or stores: the
//! engine asks the stages what to commit and tells them what committed ([`super::commit`]).
//!
//! A transaction the coordinator aborted on `transaction.timeout.ms` makes librdkafka report
//! the producer as fenced; when our own transaction is that old, nobody else took over: the
//! transaction drops its work and gets a new producer instead of ending the engine as a fenced
//! instance would ([`Transaction::replace_producer`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamapp_api::health::DeadLetterNote;
use tracing::{debug, warn};

use super::delivery::{DeliveryTracker, Origin, ProduceError, await_deliveries};
use super::{EngineConfig, EngineError, Stage, TXN_CALL_TIMEOUT, TXN_DEADLINE, default_property};
use streamapp_api::config::DEFAULT_TRANSACTION_TIMEOUT;

use crate::faults::Faults;
use crate::group::txn_offsets::{GroupGeneration, send_offsets_to_transaction};
use crate::kafka_errors::{TxnErrorFacts, TxnFailure, classify_commit, classify_txn, is_retriable};
use crate::metrics::Metrics;
use crate::shared::Shared;
use crate::txn_coordinator::{CoordinatorClient, FenceOrigin, fence_origin};

/// A record to produce inside the open transaction.
pub(super) struct Outgoing<'a> {
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// `None`: no headers (librdkafka then allocates no header list for the record).
    pub headers: Option<OwnedHeaders>,
    /// The record's time (the input record's, carried to what is derived from it); `None`:
    /// the producer's clock.
    pub timestamp: Option<i64>,
}

/// What fences the transaction's offsets (KIP-447): a zombie of an older generation cannot
/// commit them.
pub(super) enum OffsetsFence {
    /// librdkafka's group membership: its metadata.
    Consumer(rdkafka::consumer::ConsumerGroupMetadata),
    /// The processor's own membership: the member id and generation of its current share.
    Generation(GroupGeneration),
}

/// How a commit ended.
pub(super) enum CommitOutcome {
    /// Nothing was open.
    NothingOpen,
    /// Committed: what the stages learn from it.
    Committed(Committed),
    /// Kafka refused records of the transaction: they are charged to the input records they
    /// came from, and the transaction must be aborted. It is still open.
    ProduceFailed(Vec<ProduceError>),
    /// The commit failed; what to do about it. The transaction is still open, unless the
    /// failure says the coordinator ended it.
    Failed(TxnFailure),
}

/// What a committed transaction leaves for the stages and the health report.
pub(super) struct Committed {
    /// Changelog partition → the highest offset the transaction wrote there.
    pub changelog_offsets: HashMap<i32, i64>,
    pub dead_letters: Vec<DeadLetterNote>,
    pub miskeyed: u64,
}

/// The open transaction.
struct OpenTxn {
    started: Instant,
    /// Dead letters in it, counted once it commits.
    dead_letters: Vec<DeadLetterNote>,
    /// Records whose key is not their id (`check_keying`), counted once it commits.
    miskeyed: u64,
}

/// What making a producer takes (again, after a transaction timeout).
struct ProducerSetup {
    client: ClientConfig,
    transactional_id: String,
    changelog_topic: String,
    thread: usize,
    timeout: Duration,
}

/// The transactional producer and its open transaction.
pub(super) struct Transaction {
    producer: BaseProducer<DeliveryTracker>,
    open: Option<OpenTxn>,
    /// When the last commit began (see [`commit_due`]).
    last_commit: Option<Instant>,
    /// Counts aborts: a record fetched before one is not processed (it comes again).
    aborts: u64,
    setup: ProducerSetup,
    shared: Arc<Shared>,
    metrics: Metrics,
}

impl Transaction {
    /// Creates the transactional producer and initialises its transactions, which aborts what a
    /// previous incarnation left open and fences it.
    pub fn start(
        cfg: &EngineConfig,
        shared: Arc<Shared>,
        metrics: Metrics,
    ) -> Result<Self, EngineError> {
        let setup = ProducerSetup {
            client: cfg.client.clone(),
            transactional_id: cfg.transactional_id(),
            changelog_topic: cfg.changelog_topic.clone(),
            thread: cfg.thread,
            timeout: cfg.transaction_timeout(),
        };
        Ok(Transaction {
            producer: new_producer(&setup, &shared)?,
            open: None,
            last_commit: None,
            aborts: 0,
            setup,
            shared,
            metrics,
        })
    }

    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Whether the open transaction is due to commit, `interval` being the commit interval.
    pub fn commit_due(&self, interval: Duration) -> bool {
        commit_due(
            self.open.as_ref().map(|t| t.started),
            self.last_commit,
            Instant::now(),
            interval,
        )
    }

    /// How many transactions were aborted so far (a change says: rewound).
    pub fn aborts(&self) -> u64 {
        self.aborts
    }

    /// Serves the producer's callbacks (delivery reports).
    pub fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Begins a transaction unless one is open.
    pub fn begin(&mut self) -> Result<(), EngineError> {
        if self.open.is_some() {
            return Ok(());
        }
        match self.producer.begin_transaction() {
            Ok(()) => {
                self.open = Some(OpenTxn {
                    started: Instant::now(),
                    dead_letters: Vec::new(),
                    miskeyed: 0,
                });
                Ok(())
            }
            Err(e) => Err(self.error("begin_transaction", &e)),
        }
    }

    /// Notes a dead letter of the open transaction, counted once it commits.
    pub fn note_dead_letter(&mut self, note: DeadLetterNote) {
        if let Some(txn) = self.open.as_mut() {
            txn.dead_letters.push(note);
        }
    }

    /// Notes a record whose key is not its id, counted once the transaction commits.
    pub fn note_miskeyed(&mut self) {
        if let Some(txn) = self.open.as_mut() {
            txn.miskeyed += 1;
        }
    }

    /// Hands a record to the producer (waiting while its queue is full). `origin` is the
    /// consumed record it comes from, which a failed delivery is charged to.
    pub fn send(&mut self, out: Outgoing<'_>, origin: Origin) -> Result<(), ProduceError> {
        let topic = out.topic;
        let mut record: BaseRecord<'_, [u8], [u8], Box<Origin>> =
            BaseRecord::with_opaque_to(topic, Box::new(origin));
        if let Some(h) = out.headers {
            record = record.headers(h);
        }
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        if let Some(k) = out.key {
            record = record.key(k);
        }
        if let Some(v) = out.value {
            record = record.payload(v);
        }
        if let Some(t) = out.timestamp {
            record = record.timestamp(t);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(50));
                    self.shared.beat(self.setup.thread);
                }
                Err((e, _)) => {
                    return Err(ProduceError {
                        topic: topic.to_string(),
                        code: e.rdkafka_error_code(),
                        message: format!("producing to {topic}: {e}"),
                        origin: Some(origin),
                    });
                }
            }
        }
    }

    /// Commits the open transaction with the consumer `positions` (fenced by `fence`; none
    /// known: the transaction is aborted as abortable). `faults` are the test hooks around the
    /// commit.
    pub fn commit(
        &mut self,
        positions: &TopicPartitionList,
        fence: Option<OffsetsFence>,
        faults: &mut Faults,
    ) -> CommitOutcome {
        let Some(txn) = &self.open else {
            return CommitOutcome::NothingOpen;
        };
        let started = txn.started;
        let commit_start = Instant::now();
        self.last_commit = Some(commit_start);
        let failures = self.producer.context().take_failures();
        if !failures.is_empty() {
            return CommitOutcome::ProduceFailed(failures);
        }
        let Some(fence) = fence else {
            return CommitOutcome::Failed(TxnFailure::Abortable(
                "no consumer group metadata".into(),
            ));
        };
        await_deliveries(&self.producer, TXN_CALL_TIMEOUT);
        let delivered = commit_start.elapsed();
        let failures = self.producer.context().take_failures();
        if !failures.is_empty() {
            return CommitOutcome::ProduceFailed(failures);
        }
        let (shared, thread) = (&self.shared, self.setup.thread);
        let sent = match &fence {
            OffsetsFence::Consumer(group) => retry_txn(shared, thread, || {
                self.producer
                    .send_offsets_to_transaction(positions, group, TXN_CALL_TIMEOUT)
            })
            .map_err(|e| TxnErrorFacts::of(&e)),
            OffsetsFence::Generation(generation) => {
                send_offsets_with_generation(shared, thread, &self.producer, positions, generation)
            }
        };
        let offsets_sent = commit_start.elapsed();
        if sent.is_ok() {
            faults.before_commit();
        }
        // (facts, whether the commit itself was still retriable when retries stopped)
        let committed = sent.map_err(|facts| (facts, false)).and_then(|()| {
            retry_txn(shared, thread, || {
                self.producer.commit_transaction(TXN_CALL_TIMEOUT)
            })
            .map_err(|e| (TxnErrorFacts::of(&e), is_retriable(&e)))
        });
        if let Err((facts, retriable)) = committed {
            let failure = classify_commit(&facts, retriable, started.elapsed(), self.setup.timeout);
            // A record Kafka refused dooms the transaction: charge it to that record. Not when
            // the commit's outcome is unknown: it may have committed, and nothing is aborted.
            let failures = self.producer.context().take_failures();
            if !retriable && !failures.is_empty() {
                return CommitOutcome::ProduceFailed(failures);
            }
            return CommitOutcome::Failed(failure);
        }
        let txn = self.open.take().expect("open");
        self.metrics.transactions_committed.inc();
        self.metrics
            .commit_seconds
            .observe(commit_start.elapsed().as_secs_f64());
        debug!(
            txn_ms = started.elapsed().as_millis() as u64,
            deliveries_us = delivered.as_micros() as u64,
            offsets_us = (offsets_sent - delivered).as_micros() as u64,
            end_us = (commit_start.elapsed() - offsets_sent).as_micros() as u64,
            "transaction committed"
        );
        CommitOutcome::Committed(Committed {
            changelog_offsets: self.producer.context().take_offsets(),
            dead_letters: txn.dead_letters,
            miskeyed: txn.miskeyed,
        })
    }

    /// Aborts the open transaction. `None`: nothing was open. `Some(Err)`: the transaction is
    /// gone, but the engine may not go on (fenced, or a new producer could not be made).
    pub fn abort(&mut self, why: &str) -> Option<Result<(), EngineError>> {
        let txn = self.open.take()?;
        warn!(reason = why, "aborting the transaction");
        self.metrics.transactions_aborted.inc();
        // librdkafka waits for the delivery reports of the aborted records, and a BaseProducer
        // only serves them when polled: flush serves them (the records are aborted anyway).
        let _ = self.producer.flush(TXN_CALL_TIMEOUT);
        let aborted = retry_txn(&self.shared, self.setup.thread, || {
            self.producer.poll(Duration::ZERO);
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        });
        self.producer.context().clear();
        self.aborts += 1;
        let Err(e) = aborted else {
            return Some(Ok(()));
        };
        // The transaction is gone either way; what matters is whether we may go on.
        let age = txn.started.elapsed();
        Some(
            match classify_txn(&TxnErrorFacts::of(&e), Some(age), self.setup.timeout) {
                TxnFailure::TimedOut(why) => self.replace_producer(&why),
                TxnFailure::Fenced(detail) => Err(self.fenced(detail)),
                TxnFailure::Abortable(d) | TxnFailure::Fatal(d) => {
                    Err(EngineError::Fatal(format!("abort: {d}")))
                }
            },
        )
    }

    /// The coordinator aborted the open transaction on its timeout: its work is dropped, and a
    /// new producer goes on (unless another instance took over: see
    /// [`Transaction::replace_producer`]).
    pub fn end_timed_out(&mut self, why: &str) -> Result<(), EngineError> {
        self.open = None;
        self.metrics.transactions_aborted.inc();
        self.aborts += 1;
        self.replace_producer(why)
    }

    /// The error ending the engine when this pod's identity is fenced.
    pub fn fenced(&self, detail: String) -> EngineError {
        EngineError::Fenced {
            transactional_id: self.setup.transactional_id.clone(),
            detail,
        }
    }

    /// The error a failed transactional call ends the engine with (`Fatal` for an abortable
    /// one where aborting is not possible, such as `begin_transaction`).
    fn error(&self, what: &str, e: &KafkaError) -> EngineError {
        match classify_txn(&TxnErrorFacts::of(e), None, self.setup.timeout) {
            TxnFailure::Fenced(detail) => self.fenced(detail),
            TxnFailure::Abortable(d) | TxnFailure::TimedOut(d) | TxnFailure::Fatal(d) => {
                EngineError::Fatal(format!("{what}: {d}"))
            }
        }
    }

    /// A transaction with one record to the changelog, aborted: a round trip to the
    /// transaction coordinator with our producer epoch, visible to no read_committed reader.
    /// A producer librdkafka already holds for fenced fails it at once. Call with no
    /// transaction open.
    pub fn probe(&mut self) -> Result<(), TxnFailure> {
        let timeout = self.setup.timeout;
        let fatal = |producer: &BaseProducer<DeliveryTracker>| {
            producer.client().fatal_error().map(|(code, message)| {
                classify_txn(
                    &TxnErrorFacts {
                        code: Some(code),
                        fatal: true,
                        message,
                    },
                    None,
                    timeout,
                )
            })
        };
        if let Some(failure) = fatal(&self.producer) {
            return Err(failure);
        }
        let result = self.probe_round_trip();
        match (result, fatal(&self.producer)) {
            (Err(_), Some(failure)) => Err(failure),
            (result, _) => result,
        }
    }

    fn probe_round_trip(&mut self) -> Result<(), TxnFailure> {
        let timeout = self.setup.timeout;
        let fail = |e: &KafkaError| classify_txn(&TxnErrorFacts::of(e), None, timeout);
        self.producer.begin_transaction().map_err(|e| fail(&e))?;
        let record: BaseRecord<'_, [u8], [u8], Box<Origin>> = BaseRecord::with_opaque_to(
            &self.setup.changelog_topic,
            Box::new(Origin {
                stage: Stage::Dedup,
                partition: -1,
                offset: -1,
            }),
        )
        .partition(0)
        .key(b"streamapp.fence-probe".as_slice());
        if let Err((e, _)) = self.producer.send(record) {
            let _ = self.producer.abort_transaction(TXN_CALL_TIMEOUT);
            return Err(fail(&e));
        }
        await_deliveries(&self.producer, TXN_CALL_TIMEOUT);
        let aborted = retry_txn(&self.shared, self.setup.thread, || {
            self.producer.poll(Duration::ZERO);
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        });
        self.producer.context().clear();
        aborted.map_err(|e| fail(&e))
    }

    /// A fence on a transaction older than its timeout: a new producer, unless the
    /// transaction coordinator shows that another instance of this pod took the
    /// transactional id over (this one is then the zombie, and a new producer would fence the
    /// live instance).
    fn replace_producer(&mut self, why: &str) -> Result<(), EngineError> {
        let transactional_id = &self.setup.transactional_id;
        match self.ask_coordinator() {
            Ok(FenceOrigin::AnotherInstance { state }) => {
                return Err(self.fenced(format!(
                    "{why}; the transaction coordinator shows {transactional_id} in state \
                     {state}, not the abort of this transaction: another instance of this \
                     pod took it over"
                )));
            }
            Ok(FenceOrigin::Timeout) => {}
            Err(e) => warn!(error = %e,
                "could not ask the transaction coordinator who ended the transaction; taking it for its timeout"),
        }
        warn!(
            reason = why,
            timeout_ms = self.setup.timeout.as_millis() as u64,
            "the transaction outlived transaction.timeout.ms and the coordinator aborted it \
             (not a fence by another instance): its records are processed again with a new producer"
        );
        self.metrics.transaction_timeouts.inc();
        self.producer = new_producer(&self.setup, &self.shared)?;
        Ok(())
    }

    fn ask_coordinator(&self) -> Result<FenceOrigin, String> {
        self.shared.beat(self.setup.thread);
        let id = &self.setup.transactional_id;
        let state = CoordinatorClient::from_client(
            &self.setup.client,
            format!("{id}-describe"),
            TXN_CALL_TIMEOUT,
        )?
        .transaction_state(id)?;
        Ok(fence_origin(&state))
    }
}

/// Whether a transaction opened at `opened` (none open: no) is due to commit at `now`: once
/// `interval` has passed since the previous commit began, or since the transaction opened when
/// no commit came before. Kafka Streams counts `commit.interval.ms` the same way. Counting from
/// the transaction's opening instead would stretch the cadence to the interval plus the
/// commit's own time, and a record passes through two transactions (route, then dedup), each of
/// which it waits for. Public for the benchmarks' reference systems, which commit at the same
/// cadence.
pub fn commit_due(
    opened: Option<Instant>,
    last_commit: Option<Instant>,
    now: Instant,
    interval: Duration,
) -> bool {
    opened.is_some_and(|opened| {
        now.saturating_duration_since(last_commit.unwrap_or(opened)) >= interval
    })
}

/// Creates the transactional producer and initialises its transactions.
fn new_producer(
    setup: &ProducerSetup,
    shared: &Shared,
) -> Result<BaseProducer<DeliveryTracker>, EngineError> {
    let mut client = setup.client.clone();
    default_property(&mut client, "linger.ms", "5");
    // Bounded buffers: the operator's memory budget counts on them.
    default_property(&mut client, "queue.buffering.max.kbytes", "65536");
    default_property(
        &mut client,
        "transaction.timeout.ms",
        &DEFAULT_TRANSACTION_TIMEOUT.as_millis().to_string(),
    );
    let producer: BaseProducer<DeliveryTracker> = client
        .set("transactional.id", &setup.transactional_id)
        .set("enable.idempotence", "true")
        .create_with_context(DeliveryTracker::new(&setup.changelog_topic))
        .map_err(|e| EngineError::Fatal(format!("creating the producer: {e}")))?;
    retry_txn(shared, setup.thread, || {
        producer.init_transactions(TXN_CALL_TIMEOUT)
    })
    .map_err(
        |e| match classify_txn(&TxnErrorFacts::of(&e), None, setup.timeout) {
            TxnFailure::Fenced(detail) => EngineError::Fenced {
                transactional_id: setup.transactional_id.clone(),
                detail,
            },
            TxnFailure::Abortable(d) | TxnFailure::TimedOut(d) | TxnFailure::Fatal(d) => {
                EngineError::Fatal(format!("init_transactions: {d}"))
            }
        },
    )?;
    Ok(producer)
}

/// Calls a transactional function until it succeeds or fails for a reason other than a
/// retriable one (timeouts included: the operation continues in the background and calling
/// again is how to wait for it). Each retry counts as progress of the loop.
fn retry_txn(
    shared: &Shared,
    thread: usize,
    mut f: impl FnMut() -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + TXN_DEADLINE;
    loop {
        shared.beat(thread);
        match f() {
            Ok(()) => return Ok(()),
            Err(e) if is_retriable(&e) && Instant::now() < deadline => {
                debug!(error = %e, "retriable transactional error; retrying");
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends the offsets with our own membership's generation, retrying what librdkafka calls
/// retriable (as [`retry_txn`] does). A stale generation is refused: an abortable error.
fn send_offsets_with_generation<C: rdkafka::producer::ProducerContext>(
    shared: &Shared,
    thread: usize,
    producer: &BaseProducer<C>,
    positions: &TopicPartitionList,
    generation: &GroupGeneration,
) -> Result<(), TxnErrorFacts> {
    let deadline = Instant::now() + TXN_DEADLINE;
    loop {
        shared.beat(thread);
        match send_offsets_to_transaction(producer, positions, generation, TXN_CALL_TIMEOUT) {
            Ok(()) => return Ok(()),
            Err(e) if e.retriable && Instant::now() < deadline => {
                debug!(error = %e, "retriable error sending the offsets; retrying");
            }
            Err(e) => return Err(e.facts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_open_is_never_due() {
        let t = Instant::now();
        assert!(!commit_due(None, Some(t), t + ms(500), INTERVAL));
    }

    #[test]
    fn the_first_transaction_is_due_an_interval_after_it_opened() {
        let t = Instant::now();
        assert!(!commit_due(Some(t), None, t + ms(99), INTERVAL));
        assert!(commit_due(Some(t), None, t + ms(100), INTERVAL));
    }

    #[test]
    fn later_ones_are_due_an_interval_after_the_previous_commit_began() {
        // The previous commit began at t and took 30 ms; this transaction opened as it ended.
        let t = Instant::now();
        let opened = t + ms(30);
        assert!(!commit_due(Some(opened), Some(t), t + ms(99), INTERVAL));
        assert!(
            commit_due(Some(opened), Some(t), t + ms(100), INTERVAL),
            "one commit per interval, not per interval plus the commit's time"
        );
    }

    #[test]
    fn after_an_idle_spell_the_first_tick_commits() {
        let t = Instant::now();
        let opened = t + ms(5_000);
        assert!(commit_due(Some(opened), Some(t), opened, INTERVAL));
    }
}
