//! The route stage of a repartitioning topology ([`crate::repartition`]): one input record
//! inside the open transaction, written to the repartition topic keyed by its dedup id, on the
//! partition of that id. Records without a usable id, or stamped too far ahead, become dead
//! letters here, naming the input record.

use rdkafka::message::Header;

use super::Engine;
use super::consumed::Consumed;
use super::processing::{Outgoing, RecordError};
use crate::repartition;

impl Engine {
    pub(super) fn route_record(&mut self, record: &Consumed<'_>) -> Result<(), RecordError> {
        let id = match self.admit(record) {
            Ok(id) => id,
            Err(rejection) => return self.refuse(record, &rejection),
        };
        let topic = self
            .cfg
            .repartition_topic
            .clone()
            .expect("the route stage runs only when repartitioning");
        let source = record.source();
        let headers = record
            .copy_headers()
            .insert(Header {
                key: repartition::KEY_HEADER,
                value: record.key,
            })
            .insert(Header {
                key: repartition::SOURCE_HEADER,
                value: Some(&source),
            });
        self.send(
            Outgoing {
                topic: &topic,
                partition: Some(repartition::partition_for(&id, self.cfg.input_partitions)),
                key: Some(&id),
                value: record.value,
                headers,
                timestamp: Some(record.time),
            },
            record.origin(),
        )?;
        self.faults
            .after_route(record.header(crate::faults::FAULT_HEADER));
        self.metrics.records_repartitioned.inc();
        Ok(())
    }
}
