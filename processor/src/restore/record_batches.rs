//! The restore reader's records, taken from librdkafka a batch at a time: with
//! `group/txn_offsets.rs` and `engine/send_now.rs`, one of the three modules allowed `unsafe`
//! code (Cargo.toml's lint comment).
//!
//! rust-rdkafka hands a consumer's records over one poll at a time, each wrapped in an event of
//! its own: per record a queue lock, clock reads for the poll's deadline and librdkafka's poll
//! bookkeeping, an allocation for the event's handle, and a free. A full restore reads millions
//! of records on one thread, and that per-record poll was about a sixth of its time
//! (docs/performance.md). librdkafka's `rd_kafka_consume_batch_queue` takes up to a batch of
//! records from a queue in one call, which rust-rdkafka does not wrap.
//!
//! It must not serve the consumer's own queue: that queue also carries the client's errors
//! and logs, which rust-rdkafka's poll turns into its context's calls and its errors. So each
//! partition the reader restores has its fetched records (with its end-of-partition and its
//! fetch errors) forwarded to a [`RecordQueue`] of the reader's own
//! ([`RecordQueue::take_partition`]), read here, and the consumer's queue keeps everything else,
//! polled as before.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// A queue that fetched records of chosen partitions are forwarded to.
///
/// Must be dropped before the consumer it was made for (it is a field of the restorer declared
/// before the consumer).
pub(super) struct RecordQueue {
    queue: *mut rd::rd_kafka_queue_t,
}

// SAFETY: librdkafka's queues may be used from any thread; the handle is owned by this value
// alone and destroyed once, in `drop`.
unsafe impl Send for RecordQueue {}

impl RecordQueue {
    pub(super) fn new<C: ConsumerContext>(reader: &BaseConsumer<C>) -> Self {
        // SAFETY: the consumer's handle is valid for the call; the new queue is ours to
        // destroy.
        let queue = unsafe { rd::rd_kafka_queue_new(reader.client().native_ptr()) };
        assert!(!queue.is_null(), "librdkafka could not make a queue");
        RecordQueue { queue }
    }

    /// From now on `partition`'s fetched records come to this queue, never to the reader's own:
    /// once the application has forwarded a partition, librdkafka never forwards it to the
    /// consumer's queue again. But it drops the forward when the partition's fetch stops, on
    /// a thread of its own and at a time of its own, after which the partition's records wait
    /// in its queue until it is forwarded again; set before each assignment and at each
    /// step (`Restorer::step`), and what waited comes along. A lock and a lookup: nothing
    /// worth counting at a few steps a second.
    pub(super) fn take_partition<C: ConsumerContext>(
        &self,
        reader: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
    ) -> Result<(), KafkaError> {
        let topic = CString::new(topic)
            .map_err(|_| KafkaError::Subscription(format!("topic name {topic:?} holds a NUL")))?;
        // SAFETY: the consumer's handle and the topic's C string are valid for the call. The
        // partition's queue handle returned is only forwarded and destroyed here; destroying
        // the handle leaves the partition's queue (and its forward) in place.
        unsafe {
            let partition_queue = rd::rd_kafka_queue_get_partition(
                reader.client().native_ptr(),
                topic.as_ptr(),
                partition,
            );
            if partition_queue.is_null() {
                return Err(KafkaError::Subscription(format!(
                    "librdkafka has no queue for partition {partition}"
                )));
            }
            rd::rd_kafka_queue_forward(partition_queue, self.queue);
            rd::rd_kafka_queue_destroy(partition_queue);
        }
        Ok(())
    }

    /// Takes what the queue holds into `batch` (emptied first), up to its capacity and `most`;
    /// waits up to `wait` for the first record when there is none. How many were taken.
    pub(super) fn read(&self, wait: Duration, batch: &mut Batch, most: usize) -> usize {
        batch.clear();
        let wait_ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the queue is valid; librdkafka writes at most `capacity` message pointers
        // into the vector's spare capacity, and `set_len` covers exactly those it wrote. Each
        // is destroyed once, by `Batch::clear`.
        unsafe {
            let taken = rd::rd_kafka_consume_batch_queue(
                self.queue,
                wait_ms,
                batch.messages.as_mut_ptr(),
                batch.messages.capacity().min(most),
            );
            let taken = usize::try_from(taken).unwrap_or(0);
            batch.messages.set_len(taken);
            taken
        }
    }
}

impl Drop for RecordQueue {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed only here.
        unsafe { rd::rd_kafka_queue_destroy(self.queue) }
    }
}

/// Records taken from a [`RecordQueue`], owned until the next read or the batch's drop.
pub(super) struct Batch {
    messages: Vec<*mut rd::rd_kafka_message_t>,
}

impl Batch {
    pub(super) fn with_capacity(records: usize) -> Self {
        Batch {
            messages: Vec::with_capacity(records.max(1)),
        }
    }

    /// The records in the order librdkafka fetched them (each partition's in offset order).
    pub(super) fn iter(&self) -> impl Iterator<Item = Fetched<'_>> {
        self.messages.iter().map(|&message| {
            // SAFETY: each pointer is a message librdkafka handed over and not yet destroyed;
            // it lives until `clear`, which needs `&mut self`, so not while this borrow does.
            let m = unsafe { &*message };
            match m.err {
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => {}
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                    return Fetched::End {
                        partition: m.partition,
                        position: m.offset,
                    };
                }
                e => {
                    return Fetched::Error(KafkaError::MessageConsumption(RDKafkaErrorCode::from(
                        e,
                    )));
                }
            }
            Fetched::Record {
                partition: m.partition,
                offset: m.offset,
                // SAFETY: librdkafka's key and payload: `len` bytes at the pointer, or null
                // for none; valid as long as the message.
                key: unsafe { bytes(m.key, m.key_len) },
                payload: unsafe { bytes(m.payload, m.len) },
            }
        })
    }

    fn clear(&mut self) {
        for message in self.messages.drain(..) {
            // SAFETY: handed over by librdkafka and destroyed once.
            unsafe { rd::rd_kafka_message_destroy(message) }
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One entry of a batch: a record, a partition's end, or a fetch error (as rust-rdkafka's poll
/// reports it).
pub(super) enum Fetched<'b> {
    /// The partition's visible end: `position` is the offset past its last record and any
    /// transaction markers. (Ask the reader's position instead and it is one more: librdkafka's
    /// batch read moves it past each entry it hands over, the end included.)
    End {
        partition: i32,
        position: i64,
    },
    Record {
        partition: i32,
        offset: i64,
        key: Option<&'b [u8]>,
        payload: Option<&'b [u8]>,
    },
    Error(KafkaError),
}

/// # Safety
/// `ptr` is null or points at `len` readable bytes that outlive `'b`.
unsafe fn bytes<'b>(ptr: *mut std::ffi::c_void, len: usize) -> Option<&'b [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: as the caller promises.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }
}
