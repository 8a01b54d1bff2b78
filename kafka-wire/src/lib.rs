//! Kafka requests that librdkafka does not offer, spoken over connections of our own with the
//! `kafka-protocol` crate's messages: the processor's own static group membership (JoinGroup,
//! SyncGroup, Heartbeat, LeaveGroup), DescribeTransactions (a zombie told from a timed-out
//! transaction), a topic's id (Metadata v10+), the operator's removal of static members
//! whose pods a scale-in took away (DescribeGroups, LeaveGroup by instance id), and hanging
//! transactions found and ended ([`transactions`]: DescribeProducers, ListTransactions,
//! WriteTxnMarkers).
//!
//! A [`Connection`] is one blocking connection to one broker, plain, TLS or SASL, set up from
//! the same librdkafka client properties the rest of the program uses ([`Security`]).

mod connection;
pub mod groups;
mod scram;
mod security;
pub mod transactions;

pub use connection::{Connection, CoordinatorKind, WireError, open_coordinator, open_first};
pub use security::{Sasl, Security};

/// The brokers of a client configuration's `bootstrap.servers` (host:port), as these
/// connections reach them.
pub fn bootstrap_servers(client: &rdkafka::config::ClientConfig) -> Vec<String> {
    client
        .get("bootstrap.servers")
        .unwrap_or_default()
        .split(',')
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect()
}
