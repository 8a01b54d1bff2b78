//! The processor's integration tests against the real broker (and, for a few, the real
//! API server), in one binary so that RocksDB is linked once. `common` is what they share;
//! each module is one subject, described at its top.
//!
//! One test: `dev/net.sh exec cargo test --release -p streamapp-processor --test processor -- environment::`

mod common;
mod environment;
mod faults;
mod group;
mod limits;
mod pipeline;
mod probes;
mod queries;
mod repartition;
mod secure_membership;
mod soak;
mod standby;
mod threads;
