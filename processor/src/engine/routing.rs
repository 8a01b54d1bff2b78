//! The route stage of a repartitioning topology ([`crate::repartition`]): one input record
//! inside the open transaction, written to the repartition topic keyed by its dedup id, on the
//! partition of that id ([`repartition::route`]). Records without a usable id, or stamped too
//! far ahead, become dead letters here, naming the input record.

use super::Engine;
use super::consumed::Consumed;
use super::processing::RecordError;
use super::transaction::Outgoing;
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
            .as_deref()
            .expect("the route stage runs only when repartitioning");
        let (partition, headers) = repartition::route(
            &id,
            record.key,
            &record.source(),
            record.copy_headers(),
            self.cfg.input_partitions,
        );
        self.txn.send(
            Outgoing {
                topic,
                partition: Some(partition),
                key: Some(&id),
                value: record.value,
                headers: Some(headers),
                timestamp: Some(record.time),
            },
            record.origin(),
        )?;
        self.faults
            .after_route(|| record.header(crate::faults::FAULT_HEADER));
        self.metrics.records_repartitioned.inc();
        Ok(())
    }
}
