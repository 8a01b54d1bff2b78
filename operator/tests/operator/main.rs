//! The operator's integration tests against the local API server and broker, in one binary.
//! `support` is what they share; each module is one subject, described at its top.

mod autoscaling;
mod binary;
mod hanging_transactions;
mod helm_chart;
mod kafka_checks;
mod leader_election;
mod reconcile;
mod support;
mod validation;
