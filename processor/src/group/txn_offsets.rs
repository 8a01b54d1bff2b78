//! The consumer offsets of a transaction, fenced by the group generation (KIP-447): one of the
//! three places in the workspace with `unsafe` code (the others are `engine/send_now.rs` and
//! `restore/record_batches.rs`).
//!
//! A transaction commits its input offsets with the group's metadata; since KIP-447 the
//! coordinator refuses them unless the member id and generation are the group's current ones,
//! so a zombie that lost its tasks in a rebalance cannot commit for them any more.
//! librdkafka builds that metadata for a member of its own group only; for a membership the
//! processor runs itself ([`super::Membership`]) it offers
//! `rd_kafka_consumer_group_metadata_new_with_genid`, which rust-rdkafka does not wrap (its
//! `ConsumerGroupMetadata` has no public constructor). So this module calls librdkafka's C API
//! directly for exactly two things: building that metadata and sending the offsets with it.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

use crate::kafka_errors::TxnErrorFacts;

/// The generation a transaction's offsets belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupGeneration {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    /// `group.instance.id` (static membership).
    pub instance_id: Option<String>,
}

/// A failed `send_offsets_to_transaction`, as librdkafka reported it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("sending the offsets to the transaction: {}", facts.message)]
pub struct OffsetsError {
    pub facts: TxnErrorFacts,
    /// Calling again may succeed (a timeout: the request goes on in the background).
    pub retriable: bool,
    /// The transaction must be aborted (a stale generation is one such error).
    pub requires_abort: bool,
}

/// The group metadata librdkafka sends with the offsets; destroyed when dropped.
struct Metadata(*mut rd::rd_kafka_consumer_group_metadata_t);

impl Drop for Metadata {
    fn drop(&mut self) {
        // SAFETY: created by rd_kafka_consumer_group_metadata_new_with_genid, destroyed once.
        unsafe { rd::rd_kafka_consumer_group_metadata_destroy(self.0) }
    }
}

fn c_string(what: &str, s: &str) -> Result<CString, OffsetsError> {
    CString::new(s).map_err(|_| OffsetsError {
        facts: TxnErrorFacts {
            code: Some(RDKafkaErrorCode::InvalidArgument),
            fatal: false,
            message: format!("the {what} contains a NUL byte"),
        },
        retriable: false,
        requires_abort: false,
    })
}

/// Adds `offsets` (the next offset to read, per input partition) to the producer's open
/// transaction as the group's offsets for `generation`. The coordinator refuses them when the
/// generation is not the group's current one (`IllegalGeneration`, which requires an abort).
pub fn send_offsets_to_transaction<C: ProducerContext>(
    producer: &BaseProducer<C>,
    offsets: &TopicPartitionList,
    generation: &GroupGeneration,
    timeout: Duration,
) -> Result<(), OffsetsError> {
    let group_id = c_string("group id", &generation.group_id)?;
    let member_id = c_string("member id", &generation.member_id)?;
    let instance_id = generation
        .instance_id
        .as_deref()
        .map(|i| c_string("group instance id", i))
        .transpose()?;
    // SAFETY: the strings outlive the call (librdkafka copies them into the metadata); a null
    // instance id means none, as librdkafka documents.
    let metadata = Metadata(unsafe {
        rd::rd_kafka_consumer_group_metadata_new_with_genid(
            group_id.as_ptr(),
            generation.generation_id,
            member_id.as_ptr(),
            instance_id
                .as_ref()
                .map_or(std::ptr::null(), |i| i.as_ptr()),
        )
    });
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: the producer handle, the partition list and the metadata are valid for the whole
    // call; librdkafka does not keep the list or the metadata after it returns.
    let error = unsafe {
        rd::rd_kafka_send_offsets_to_transaction(
            producer.client().native_ptr(),
            offsets.ptr(),
            metadata.0,
            timeout_ms,
        )
    };
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null error from librdkafka, read and then destroyed exactly once.
    let failure = unsafe {
        let message = CStr::from_ptr(rd::rd_kafka_error_string(error))
            .to_string_lossy()
            .into_owned();
        let failure = OffsetsError {
            facts: TxnErrorFacts {
                code: Some(RDKafkaErrorCode::from(rd::rd_kafka_error_code(error))),
                fatal: rd::rd_kafka_error_is_fatal(error) != 0,
                message,
            },
            retriable: rd::rd_kafka_error_is_retriable(error) != 0,
            requires_abort: rd::rd_kafka_error_txn_requires_abort(error) != 0,
        };
        rd::rd_kafka_error_destroy(error);
        failure
    };
    Err(failure)
}
