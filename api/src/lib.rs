//! What StreamApp's programs must agree on.
//!
//! - [`annotations`]: the annotations that operate a StreamApp (pause, restart, reset).
//! - [`crd`]: the `StreamApp` custom resource (spec written by users, status written by the
//!   operator and, per pod, by the agents).
//! - [`config`]: the processor's configuration file, which the operator renders into a
//!   ConfigMap and the processor reads.
//! - [`dead_letters`]: the processor's dead-letter listing (`GET /dead-letters`): its query,
//!   its limits and its answer, as the processor serves it and `kubectl streamapp
//!   dead-letters` asks it.
//! - [`health`]: the health file the processor keeps in its state directory, which the agent
//!   reads.
//! - [`lookup`]: the processor's id lookup (`GET /lookup`): its query, its limits and its
//!   answer, as the processor serves it and `kubectl streamapp lookup` asks it.
//! - [`probe`]: the processor's local HTTP endpoints and a tiny client for them.
//! - [`status_values`]: the values of the status fields that are enumerations (phases, task
//!   states), spelled once for the operator, the agents and the plugin.
//! - [`state_volume`]: what the processor keeps on its state volume (stores, checkpoints, WAL
//!   files, quarantined stores) and where, which `inspect` and the agent read.
//! - [`units`]: the duration and quantity notations these use.

pub mod annotations;
pub mod config;
pub mod crd;
pub mod dead_letters;
pub mod health;
pub mod identity;
pub mod lookup;
pub mod probe;
pub mod state_volume;
pub mod status_values;
pub mod units;
