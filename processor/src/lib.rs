//! The StreamApp processor as a library: the binary (`main.rs` and its `startup` module) wires
//! these together, and integration tests reach the pieces they check.

pub mod changelog;
pub mod dead_letters;
pub mod engine;
pub mod faults;
pub mod group;
pub mod health_file;
pub mod http;
pub mod inspect;
pub mod internal_topic;
pub mod json_pointer;
pub mod kafka_errors;
pub mod lifecycle;
pub mod log_ends;
pub mod lookup;
pub mod metrics;
pub mod open_transactions;
pub mod probes;
pub mod quarantine;
pub mod record_attempts;
pub mod repartition;
pub mod restore;
pub mod shared;
pub mod state_updater;
pub mod store;
pub mod task_position;
pub mod topics;
pub mod topology;
pub mod txn_coordinator;
pub mod workers;
