//! The route stage of a repartitioning topology ([`crate::repartition`]): one input record
//! inside the open transaction, written to the repartition topic keyed by its dedup id, on the
//! partition of that id. Records without a usable id, or stamped too far ahead, become dead
//! letters here, naming the input record.

use rdkafka::message::Header;

use super::Engine;
use super::processing::{Consumed, Outgoing, RecordError};
use crate::repartition;
use crate::shared::now_ms;
use crate::topology::{self, RecordView};

impl Engine {
    pub(super) fn route_record(&mut self, record: &Consumed<'_>) -> Result<(), RecordError> {
        let header = |name: &str| record.header(name);
        let view = RecordView {
            key: record.key,
            value: record.value,
            header: &header,
        };
        let id = match topology::extract_id(&view, &self.cfg.dedup_id, self.cfg.max_value_bytes) {
            Ok(id) => id,
            Err(rejection) => {
                return self.dead_letter(
                    record,
                    rejection.code(),
                    &rejection.detail(),
                    rejection.metadata_only(),
                );
            }
        };
        if let Err(rejection) =
            topology::check_time(record.time, now_ms(), self.cfg.max_skew.as_millis() as i64)
        {
            return self.dead_letter(record, rejection.code(), &rejection.detail(), false);
        }
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
