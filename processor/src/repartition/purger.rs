//! The purge of the repartition topic: what the dedup stage has committed is deleted from it,
//! as Kafka Streams does, so the topic does not grow with the input.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use tracing::{debug, warn};

/// How often the dedup stage's committed offsets are purged (Kafka Streams'
/// `repartition.purge.interval.ms` default).
pub const PURGE_INTERVAL: Duration = Duration::from_secs(30);

/// Deletes what the dedup stage has committed from the repartition topic, on a thread of its
/// own: the processing loop hands it the committed offsets and never waits for the broker.
///
/// A partition counts as purged up to an offset only once the broker said so: a purge that
/// failed (a broker away) is asked for again at the next interval, even when the partition
/// has been idle since.
pub struct Purger {
    tx: mpsc::Sender<BTreeMap<i32, i64>>,
    /// Offsets the broker confirmed, by partition (written by the purge thread).
    purged: Arc<Mutex<BTreeMap<i32, i64>>>,
}

/// The committed offsets still to purge: those the broker has not confirmed yet.
pub fn still_to_purge(
    committed: &BTreeMap<i32, i64>,
    purged: &BTreeMap<i32, i64>,
) -> BTreeMap<i32, i64> {
    committed
        .iter()
        .filter(|(p, o)| purged.get(p).is_none_or(|done| done < o))
        .map(|(&p, &o)| (p, o))
        .collect()
}

impl Purger {
    pub fn start(client: &ClientConfig, topic: &str) -> Result<Purger, rdkafka::error::KafkaError> {
        // The first client is made here so that a bad configuration fails the start.
        let first: AdminClient<DefaultClientContext> = client.create()?;
        let client = client.clone();
        let (tx, rx) = mpsc::channel::<BTreeMap<i32, i64>>();
        let topic = topic.to_string();
        let purged = Arc::new(Mutex::new(BTreeMap::new()));
        let confirmed = purged.clone();
        std::thread::Builder::new()
            .name("repartition-purge".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("purge runtime");
                let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
                let mut admin = Some(first);
                // Ends when the engine (the sender) goes.
                while let Ok(mut offsets) = rx.recv() {
                    // Only the newest request matters.
                    while let Ok(newer) = rx.try_recv() {
                        offsets.extend(newer);
                    }
                    let client_now = match admin.take() {
                        Some(a) => a,
                        None => match client.create() {
                            Ok(a) => a,
                            Err(e) => {
                                warn!(topic = %topic, error = %e, "no admin client to purge the repartition topic; it is asked for again at the next interval");
                                continue;
                            }
                        },
                    };
                    let mut tpl = TopicPartitionList::new();
                    for (&p, &o) in &offsets {
                        tpl.add_partition_offset(&topic, p, rdkafka::Offset::Offset(o))
                            .expect("valid offset");
                    }
                    let mut failed = false;
                    match runtime.block_on(client_now.delete_records(&tpl, &options)) {
                        Ok(result) => {
                            let mut confirmed = confirmed.lock().expect("purged offsets");
                            for e in result.elements() {
                                match e.error() {
                                    Err(err) => {
                                        failed = true;
                                        warn!(topic = %topic, partition = e.partition(), error = %err, "purging the repartition topic failed; it is asked for again at the next interval");
                                    }
                                    Ok(()) => {
                                        if let Some(&o) = offsets.get(&e.partition()) {
                                            confirmed.insert(e.partition(), o);
                                        }
                                    }
                                }
                            }
                            debug!(topic = %topic, ?offsets, "purged the repartition topic");
                        }
                        Err(e) => {
                            failed = true;
                            warn!(topic = %topic, error = %e, "purging the repartition topic failed; it is asked for again at the next interval")
                        }
                    }
                    // After a failure the next attempt gets a new client: one that lived
                    // through a broker restart can keep answering from a stale view of the
                    // partitions' leaders ("No such entry") however often it is asked.
                    if !failed {
                        admin = Some(client_now);
                    }
                }
            })
            .expect("purge thread");
        Ok(Purger { tx, purged })
    }

    /// Asks for every record before `committed` (partition → committed offset) to be deleted,
    /// where the broker has not confirmed that yet.
    pub fn purge(&self, committed: &BTreeMap<i32, i64>) {
        let offsets = still_to_purge(committed, &self.purged.lock().expect("purged offsets"));
        if !offsets.is_empty() {
            let _ = self.tx.send(offsets);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purge_the_broker_did_not_confirm_is_asked_for_again_while_the_partition_is_idle() {
        let committed = BTreeMap::from([(0, 100), (1, 50)]);
        assert_eq!(
            still_to_purge(&committed, &BTreeMap::new()),
            committed,
            "nothing confirmed yet"
        );
        // Partition 0's purge went through; partition 1's failed (a broker away) and the
        // partition got no record since: it is still asked for.
        let confirmed = BTreeMap::from([(0, 100)]);
        assert_eq!(
            still_to_purge(&committed, &confirmed),
            BTreeMap::from([(1, 50)])
        );
        assert!(still_to_purge(&committed, &BTreeMap::from([(0, 100), (1, 50)])).is_empty());
    }
}
