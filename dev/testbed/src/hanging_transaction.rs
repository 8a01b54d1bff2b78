//! A *hanging* transaction on demand: open on a partition while no transaction coordinator will
//! ever end it, what the operator's transaction doctor finds and ends.

use std::time::Duration;

use streamapp_kafka_wire::transactions::leaders;
use streamapp_kafka_wire::{Connection, Security};

use crate::kafka;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A connection of our own to the transaction coordinator of `transactional_id`.
pub fn coordinator(transactional_id: &str) -> Connection {
    streamapp_kafka_wire::open_coordinator(
        &[kafka::bootstrap()],
        "testbed",
        TIMEOUT,
        &Security::default(),
        streamapp_kafka_wire::CoordinatorKind::Transaction,
        transactional_id,
    )
    .unwrap_or_else(|e| panic!("connecting to the coordinator of {transactional_id}: {e}"))
}

/// A connection of our own to the broker at `address` (plain, as the local broker listens).
pub fn connect(address: &str) -> Connection {
    Connection::open(address, "testbed", TIMEOUT, &Security::default())
        .unwrap_or_else(|e| panic!("connecting to {address}: {e}"))
}

/// Broker-wide dynamic configuration, set with Kafka's own `kafka-configs.sh`.
fn set_broker_default(config: &str) {
    kafka::tool(&[
        "org.apache.kafka.tools.ConfigCommand",
        "--alter",
        "--entity-type",
        "brokers",
        "--entity-default",
        "--add-config",
        config,
    ]);
}

/// Partition verification off while it lives (Kafka 3.6+ checks each transactional write
/// against its coordinator; without that check a write the coordinator does not know of is
/// what made transactions hang before KIP-890). One at a time: the setting is the broker's,
/// and tests run side by side.
struct VerificationOff(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

static BROKER_SETTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl VerificationOff {
    fn new() -> Self {
        let held = BROKER_SETTING.lock().unwrap_or_else(|e| e.into_inner());
        set_broker_default("transaction.partition.verification.enable=false");
        VerificationOff(held)
    }
}

impl Drop for VerificationOff {
    fn drop(&mut self) {
        set_broker_default("transaction.partition.verification.enable=true");
    }
}

/// Makes a hanging transaction on `topic`-`partition`, deterministically, as a client before
/// KIP-890 could, and returns its transactional id: a producer id from its coordinator, then one
/// transactional record written straight to the partition's leader without adding the
/// partition to the transaction (Produce v9, partition verification off). The partition then
/// has a transaction open that its coordinator does not know of: nothing will ever end it.
pub fn make(topic: &str, partition: i32) -> String {
    let txn_id = crate::unique_name("hanging");
    make_as(topic, partition, &txn_id);
    txn_id
}

/// [`make`] with the transactional id `txn_id` (one of an app's pods, say).
pub fn make_as(topic: &str, partition: i32, txn_id: &str) {
    use bytes::BytesMut;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        InitProducerIdRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
    };
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    let _off = VerificationOff::new();
    let id = TransactionalId(StrBytes::from_string(txn_id.to_string()));
    // A coordinator still loading (a broker just started), or one that moved, answers with a
    // retriable error: ask again (the coordinator found anew) for up to half a minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let init = loop {
        let init = coordinator(txn_id)
            .send_at(
                4,
                &InitProducerIdRequest::default()
                    .with_transactional_id(Some(id.clone()))
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
            .unwrap();
        // COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR.
        if [14, 15, 16].contains(&init.error_code) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break init;
    };
    assert_eq!(init.error_code, 0, "InitProducerId");
    let record = Record {
        transactional: true,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: init.producer_id.0,
        producer_epoch: init.producer_epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: 0,
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
        key: Some(bytes::Bytes::from_static(b"k")),
        value: Some(bytes::Bytes::from_static(b"hanging")),
        headers: Default::default(),
    };
    let mut batch = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        [&record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    let produce = ProduceRequest::default()
        .with_transactional_id(Some(id))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch.freeze())),
                ]),
        ]);
    let mut bootstrap = connect(&kafka::bootstrap());
    let cluster = leaders(&mut bootstrap, &[topic.to_string()]).unwrap();
    let leader = &cluster.brokers[&cluster.leaders[&(topic.to_string(), partition)]];
    let response = connect(leader).send_at(9, &produce).unwrap();
    let code = response
        .responses
        .iter()
        .flat_map(|t| &t.partition_responses)
        .map(|p| p.error_code)
        .next();
    assert_eq!(
        code,
        Some(0),
        "the transactional write was refused: {response:?}"
    );
}
