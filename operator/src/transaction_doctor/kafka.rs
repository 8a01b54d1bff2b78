//! The doctor's reads and its one write, on an app's Kafka, blocking (run them on the blocking
//! pool): where each partition's readers stop and where it ends, what holds a stuck partition
//! (its open transaction and what the coordinators know of its producer), and the abort marker.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use streamapp_kafka_wire::transactions::{self, Leaders, PartitionProducer};
use streamapp_kafka_wire::{
    Connection, CoordinatorKind, Security, bootstrap_servers, open_coordinator, open_first,
};

use super::{CoordinatorView, Offsets, OpenTransaction, Suspect, TopicPartition};

const REQUEST: Duration = Duration::from_secs(10);
const CLIENT_ID: &str = "streamapp-operator-transactions";

/// Connections to an app's brokers.
pub struct Brokers {
    bootstrap: Vec<String>,
    security: Security,
}

impl Brokers {
    pub fn new(config: &ClientConfig) -> Result<Self, String> {
        Ok(Brokers {
            bootstrap: bootstrap_servers(config),
            security: Security::from_client(config)?,
        })
    }

    fn connect(&self, address: &str) -> Result<Connection, String> {
        Connection::open(address, CLIENT_ID, REQUEST, &self.security).map_err(|e| e.to_string())
    }

    /// The leaders of `topics`' partitions (a topic that does not exist has none).
    pub fn leaders(&self, topics: &[String]) -> Result<Leaders, String> {
        let mut connection = open_first(&self.bootstrap, CLIENT_ID, REQUEST, &self.security)?;
        transactions::leaders(&mut connection, topics)
    }

    /// The last stable offset and the end of every partition `leaders` names, one request of
    /// each kind per leader.
    pub fn offsets(&self, leaders: &Leaders) -> Result<BTreeMap<TopicPartition, Offsets>, String> {
        let mut by_leader: BTreeMap<i32, Vec<TopicPartition>> = BTreeMap::new();
        for (tp, leader) in &leaders.leaders {
            by_leader.entry(*leader).or_default().push(tp.clone());
        }
        let mut offsets = BTreeMap::new();
        for (leader, partitions) in by_leader {
            let mut connection = self.connect(address(leaders, leader)?)?;
            let stable = transactions::end_offsets(&mut connection, &partitions, true)?;
            let end = transactions::end_offsets(&mut connection, &partitions, false)?;
            for tp in partitions {
                if let (Some(&stable), Some(&end)) = (stable.get(&tp), end.get(&tp)) {
                    offsets.insert(tp, Offsets { stable, end });
                }
            }
        }
        Ok(offsets)
    }

    /// What holds each suspect partition back: the transaction open there that starts at its
    /// last stable offset, with what the coordinators know of its producer. A suspect whose
    /// leader shows no such transaction (it ended meanwhile) is left out.
    pub fn holders(&self, leaders: &Leaders, suspects: &[Suspect]) -> Result<Vec<Holder>, String> {
        let mut found = Vec::new();
        for suspect in suspects {
            let (topic, partition) = &suspect.partition;
            let Some(&leader) = leaders.leaders.get(&suspect.partition) else {
                continue;
            };
            let mut connection = self.connect(address(leaders, leader)?)?;
            let producers =
                transactions::describe_producers(&mut connection, topic, &[*partition])?
                    .remove(partition)
                    .unwrap_or(Ok(Vec::new()))?;
            if let Some(producer) = producers
                .into_iter()
                .find(|p| p.open_transaction_start == Some(suspect.stable))
            {
                found.push(Holder {
                    partition: suspect.partition.clone(),
                    leader,
                    producer,
                    known: None,
                });
            }
        }
        if found.is_empty() {
            return Ok(found);
        }
        // Which transactional id each producer id belongs to: every broker coordinates some.
        let ids: Vec<i64> = found.iter().map(|h| h.producer.producer_id).collect();
        let mut listed = BTreeMap::new();
        for address in leaders.brokers.values() {
            let mut connection = self.connect(address)?;
            for t in transactions::list_transactions(&mut connection, &ids)? {
                listed.insert(t.producer_id, t.transactional_id);
            }
        }
        for holder in &mut found {
            let Some(transactional_id) = listed.get(&holder.producer.producer_id) else {
                continue;
            };
            let mut coordinator = open_coordinator(
                &self.bootstrap,
                CLIENT_ID,
                REQUEST,
                &self.security,
                CoordinatorKind::Transaction,
                transactional_id,
            )?;
            let described = transactions::describe_transaction(&mut coordinator, transactional_id)?;
            holder.known = Some(CoordinatorView {
                transactional_id: transactional_id.clone(),
                producer_epoch: described.producer_epoch,
                state: described.state,
                partitions: described.partitions,
            });
        }
        Ok(found)
    }

    /// Ends `holder`'s transaction on its partition with an abort marker.
    pub fn abort(&self, leaders: &Leaders, holder: &Holder) -> Result<(), String> {
        let mut connection = self.connect(address(leaders, holder.leader)?)?;
        let (topic, partition) = &holder.partition;
        transactions::write_abort_marker(&mut connection, topic, *partition, &holder.producer)
    }
}

fn address(leaders: &Leaders, broker: i32) -> Result<&str, String> {
    leaders
        .brokers
        .get(&broker)
        .map(String::as_str)
        .ok_or_else(|| format!("broker {broker} is not in the cluster's metadata"))
}

/// The transaction holding a partition back, and what its coordinator knows of it.
#[derive(Clone, Debug)]
pub struct Holder {
    pub partition: TopicPartition,
    /// The partition's leader (broker id).
    pub leader: i32,
    pub producer: PartitionProducer,
    /// `None`: no coordinator lists its producer id.
    pub known: Option<CoordinatorView>,
}

impl Holder {
    pub fn open_transaction(&self) -> OpenTransaction {
        OpenTransaction {
            producer_id: self.producer.producer_id,
            producer_epoch: self.producer.producer_epoch,
            coordinator_epoch: self.producer.coordinator_epoch,
            start_offset: self.producer.open_transaction_start.unwrap_or(-1),
        }
    }
}
