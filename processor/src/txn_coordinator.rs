//! What the transaction coordinator holds for this pod's `transactional.id`, asked when the
//! producer was fenced on a transaction older than `transaction.timeout.ms`.
//!
//! librdkafka reports the same fence whether the coordinator aborted our transaction on its
//! timeout (nobody else is involved: a new producer goes on) or another instance of the pod
//! initialised the same `transactional.id` (we are the zombie: a new producer would fence the
//! live instance, which would fence us back in turn). The age of the transaction cannot tell
//! them apart when a zombie was stopped longer than the timeout; the coordinator can
//! (DescribeTransactions, KIP-664): after a timeout it shows our transaction aborted and
//! nothing since, after another instance's `init_transactions` it shows that instance's state.

use std::time::Duration;

use rdkafka::config::ClientConfig;

use streamapp_kafka_wire::{self as wire, CoordinatorKind, Security};

/// Who ended a transaction that was fenced, by the coordinator's state of the transactional id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceOrigin {
    /// The transaction was aborted and nothing happened on the id since: the coordinator's
    /// timeout.
    Timeout,
    /// The id moved on (a new producer epoch initialised it, began or ended transactions):
    /// another instance holds it.
    AnotherInstance { state: String },
}

/// Reads the coordinator's state of the transactional id (`TransactionState` as
/// `kafka-transactions.sh describe` prints it).
pub fn fence_origin(state: &str) -> FenceOrigin {
    match state {
        "PrepareAbort" | "CompleteAbort" => FenceOrigin::Timeout,
        other => FenceOrigin::AnotherInstance {
            state: other.to_string(),
        },
    }
}

/// Where to reach the coordinator, and how.
pub struct CoordinatorClient {
    bootstrap: Vec<String>,
    security: Security,
    client_id: String,
    timeout: Duration,
}

impl CoordinatorClient {
    /// Reaches the brokers of a Kafka client configuration with its TLS and SASL settings.
    pub fn from_client(
        client: &ClientConfig,
        client_id: String,
        timeout: Duration,
    ) -> Result<Self, String> {
        Ok(CoordinatorClient {
            bootstrap: wire::bootstrap_servers(client),
            security: Security::from_client(client)?,
            client_id,
            timeout,
        })
    }

    /// The coordinator's `TransactionState` of `transactional_id`.
    pub fn transaction_state(&self, transactional_id: &str) -> Result<String, String> {
        let mut connection = wire::open_coordinator(
            &self.bootstrap,
            &self.client_id,
            self.timeout,
            &self.security,
            CoordinatorKind::Transaction,
            transactional_id,
        )?;
        Ok(wire::transactions::describe_transaction(&mut connection, transactional_id)?.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_abort_with_nothing_since_is_the_coordinators_timeout() {
        for state in ["PrepareAbort", "CompleteAbort"] {
            assert_eq!(fence_origin(state), FenceOrigin::Timeout, "{state}");
        }
        // Another instance initialised the id (Empty), fenced an open transaction of ours
        // (PrepareEpochFence), or has been working with it since.
        for state in [
            "Empty",
            "Ongoing",
            "PrepareCommit",
            "CompleteCommit",
            "PrepareEpochFence",
        ] {
            assert_eq!(
                fence_origin(state),
                FenceOrigin::AnotherInstance {
                    state: state.into()
                },
                "{state}"
            );
        }
    }
}
