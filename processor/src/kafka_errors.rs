//! What the engine makes of Kafka's errors: decisions only, on plain facts, so each one is a
//! unit test. The engine turns an rdkafka error into these facts ([`TxnErrorFacts::of`]) and
//! acts on the answer.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What failed producing one record means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProduceFailure {
    /// Trying again later may work: a timeout, a broker away, a transaction already doomed by
    /// another record's failure, records purged by an abort.
    Transient,
    /// This record cannot be written however often it is tried (too large, invalid). After
    /// `topology.maxRecordAttempts` it goes to the dead-letter topic.
    Record,
    /// Nothing can be written to the topic: it does not exist, or this principal may not write
    /// it. Dead-lettering every record would hide that; the processor stops with a clear error.
    Topic,
}

/// Classifies the error of a record's delivery (or of handing it to the producer).
pub fn classify_produce(code: RDKafkaErrorCode) -> ProduceFailure {
    use RDKafkaErrorCode::*;
    match code {
        MessageSizeTooLarge | MessageBatchTooLarge | InvalidRecord | InvalidMessage
        | InvalidMessageSize | BadMessage => ProduceFailure::Record,
        UnknownTopic
        | UnknownPartition
        | UnknownTopicOrPartition
        | TopicAuthorizationFailed
        | InvalidTopic => ProduceFailure::Topic,
        _ => ProduceFailure::Transient,
    }
}

/// Whether an error of a changelog reader (a restore, a standby follower) is Kafka being away
/// for a while — a broker restarting, every broker down for a moment, a leader moving, a
/// request timing out — which librdkafka recovers from by itself and the reader waits out.
/// Anything else (the topic gone, no permission, a bad configuration) stops the reader.
pub fn reader_error_is_transient(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    let Some(code) = e.rdkafka_error_code() else {
        return false;
    };
    matches!(
        code,
        BrokerTransportFailure
            | AllBrokersDown
            | OperationTimedOut
            | TimedOutQueue
            | RequestTimedOut
            | Resolve
            | NetworkException
            | LeaderNotAvailable
            | NotLeaderForPartition
            | FencedLeaderEpoch
            | UnknownLeaderEpoch
            | ReplicaNotAvailable
            | BrokerNotAvailable
            | NotCoordinator
            | CoordinatorNotAvailable
            | CoordinatorLoadInProgress
            | KafkaStorageError
            | Interrupted
            | WaitCache
    )
}

/// What a failed transactional call (begin, send offsets, commit, abort, a produce that doomed
/// the transaction) tells, as far as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnErrorFacts {
    pub code: Option<RDKafkaErrorCode>,
    /// librdkafka says the producer is unusable.
    pub fatal: bool,
    pub message: String,
}

impl TxnErrorFacts {
    pub fn of(e: &KafkaError) -> Self {
        let fatal = match e {
            KafkaError::Transaction(t) => t.is_fatal(),
            _ => false,
        };
        TxnErrorFacts {
            code: e.rdkafka_error_code(),
            fatal,
            message: e.to_string(),
        }
    }
}

/// What to do about a failed transactional call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnFailure {
    /// Abort the transaction and go on: its records are processed again.
    Abortable(String),
    /// The transaction coordinator aborted our transaction because it stayed open longer than
    /// `transaction.timeout.ms`, and bumped the producer epoch: librdkafka reports that as a
    /// fence. Nobody else took over: recreate the producer and go on.
    TimedOut(String),
    /// Another instance with the same `transactional.id` (the same pod identity) took over:
    /// this one must stop writing.
    Fenced(String),
    /// The producer is unusable for another reason: start the engine again.
    Fatal(String),
}

/// Decides what a transactional error means. librdkafka reports the same fencing error (an
/// invalid producer epoch) whether another instance initialised our `transactional.id` or the
/// coordinator aborted our own transaction on its timeout. The age of our open transaction
/// tells them apart: the coordinator only aborts transactions older than the timeout, and a
/// younger one can only have been fenced by someone else.
pub fn classify_txn(
    facts: &TxnErrorFacts,
    txn_age: Option<Duration>,
    txn_timeout: Duration,
) -> TxnFailure {
    use RDKafkaErrorCode::*;
    let fence = matches!(
        facts.code,
        Some(ProducerFenced | InvalidProducerEpoch | Fenced)
    );
    let message = facts.message.clone();
    if fence {
        if txn_age.is_some_and(|age| age >= txn_timeout) {
            TxnFailure::TimedOut(message)
        } else {
            TxnFailure::Fenced(message)
        }
    } else if facts.fatal {
        TxnFailure::Fatal(message)
    } else {
        TxnFailure::Abortable(message)
    }
}

/// What a `commit_transaction` that failed means. One still failing with a retriable error
/// (a timeout) when the engine stops retrying has an outcome only the coordinator knows: it
/// may commit after all. Aborting and processing the records again would then output them
/// twice, so the engine starts again instead: a new producer's `init_transactions` waits for
/// the coordinator to finish (or abort) the transaction, the stores catch up from the
/// changelog and the consumer starts from what the group committed.
pub fn classify_commit(
    facts: &TxnErrorFacts,
    retriable: bool,
    txn_age: Duration,
    txn_timeout: Duration,
) -> TxnFailure {
    if retriable {
        TxnFailure::Fatal(format!(
            "the commit's outcome is unknown ({}): starting again so the coordinator decides it",
            facts.message
        ))
    } else {
        classify_txn(facts, Some(txn_age), txn_timeout)
    }
}

/// Whether calling the same transactional function again is the answer (a timeout: the
/// operation goes on in the background; rust-rdkafka's flush before a commit timing out).
pub fn is_retriable(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_retriable(),
        KafkaError::Flush(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    fn facts(code: RDKafkaErrorCode, fatal: bool) -> TxnErrorFacts {
        TxnErrorFacts {
            code: Some(code),
            fatal,
            message: format!("{code:?}"),
        }
    }

    #[test]
    fn a_fence_while_our_transaction_is_young_is_another_instance() {
        for code in [Fenced, ProducerFenced, InvalidProducerEpoch] {
            assert!(matches!(
                classify_txn(&facts(code, true), Some(Duration::from_secs(1)), TIMEOUT),
                TxnFailure::Fenced(_)
            ));
            assert!(
                matches!(
                    classify_txn(&facts(code, true), None, TIMEOUT),
                    TxnFailure::Fenced(_)
                ),
                "no transaction open: nothing of ours could time out"
            );
        }
    }

    #[test]
    fn a_fence_once_our_transaction_outlived_its_timeout_is_the_coordinator_aborting_it() {
        for code in [Fenced, InvalidProducerEpoch] {
            assert!(matches!(
                classify_txn(&facts(code, true), Some(Duration::from_secs(12)), TIMEOUT),
                TxnFailure::TimedOut(_)
            ));
        }
    }

    #[test]
    fn a_commit_still_timing_out_at_the_deadline_restarts_the_engine_instead_of_aborting() {
        let young = Duration::from_secs(1);
        assert!(matches!(
            classify_commit(&facts(OperationTimedOut, false), true, young, TIMEOUT),
            TxnFailure::Fatal(m) if m.contains("outcome is unknown")
        ));
        assert!(matches!(
            classify_commit(
                &facts(InvalidTransactionalState, false),
                false,
                young,
                TIMEOUT
            ),
            TxnFailure::Abortable(_)
        ));
        assert!(matches!(
            classify_commit(&facts(ProducerFenced, true), false, young, TIMEOUT),
            TxnFailure::Fenced(_)
        ));
    }

    #[test]
    fn other_fatal_errors_restart_the_engine_and_the_rest_abort() {
        assert!(matches!(
            classify_txn(&facts(InvalidTransactionalState, true), None, TIMEOUT),
            TxnFailure::Fatal(_)
        ));
        assert!(matches!(
            classify_txn(&facts(MessageSizeTooLarge, false), None, TIMEOUT),
            TxnFailure::Abortable(_)
        ));
    }

    #[test]
    fn a_changelog_reader_waits_out_kafka_being_away_and_stops_for_the_rest() {
        for transient in [
            BrokerTransportFailure,
            AllBrokersDown,
            NotLeaderForPartition,
            LeaderNotAvailable,
            RequestTimedOut,
        ] {
            assert!(
                reader_error_is_transient(&KafkaError::MessageConsumption(transient)),
                "{transient:?}"
            );
            assert!(
                reader_error_is_transient(&KafkaError::MetadataFetch(transient)),
                "{transient:?}"
            );
        }
        for fatal in [
            TopicAuthorizationFailed,
            UnknownTopicOrPartition,
            OffsetOutOfRange,
            InvalidConfig,
        ] {
            assert!(
                !reader_error_is_transient(&KafkaError::MessageConsumption(fatal)),
                "{fatal:?}"
            );
        }
        assert!(!reader_error_is_transient(&KafkaError::Canceled));
    }

    #[test]
    fn produce_errors_are_the_record_the_topic_or_passing() {
        assert_eq!(
            classify_produce(MessageSizeTooLarge),
            ProduceFailure::Record
        );
        assert_eq!(classify_produce(InvalidRecord), ProduceFailure::Record);
        assert_eq!(classify_produce(UnknownTopic), ProduceFailure::Topic);
        assert_eq!(
            classify_produce(TopicAuthorizationFailed),
            ProduceFailure::Topic
        );
        for transient in [
            MessageTimedOut,
            RequestTimedOut,
            NotEnoughReplicas,
            PurgeQueue,
            PurgeInflight,
            AllBrokersDown,
            State,
        ] {
            assert_eq!(
                classify_produce(transient),
                ProduceFailure::Transient,
                "{transient:?}"
            );
        }
    }
}
