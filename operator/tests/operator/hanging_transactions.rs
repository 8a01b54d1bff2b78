//! The transaction doctor's view of Kafka, against the real broker: an open transaction found
//! on its partition (DescribeProducers, checked against Kafka's own `kafka-transactions.sh
//! describe-producers`), what its coordinator knows of it (ListTransactions,
//! DescribeTransactions), the partition's last stable offset held back by it, and an abort
//! marker written to the partition's leader that ends it there, as `kafka-transactions.sh
//! abort` does.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer};
use streamapp_kafka_wire::transactions::{self, PartitionProducer};
use streamapp_kafka_wire::{Connection, Security};
use streamapp_operator::transaction_doctor::{
    CoordinatorView, Finding, Offsets, OpenTransaction, StuckSince, diagnose,
};
use testbed::kafka::{self, Isolation};

const TIMEOUT: Duration = Duration::from_secs(10);

fn connect(address: &str) -> Connection {
    Connection::open(address, "hanging-test", TIMEOUT, &Security::default())
        .unwrap_or_else(|e| panic!("connecting to {address}: {e}"))
}

/// (last stable offset, end) of `topic`-`partition`: what read_committed and read_uncommitted
/// readers see as its end.
fn stable_and_end(topic: &str, partition: i32) -> Offsets {
    let end_of = |isolation: &str| {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", kafka::bootstrap())
            .set("isolation.level", isolation)
            .create()
            .expect("creating a consumer");
        consumer
            .fetch_watermarks(topic, partition, TIMEOUT)
            .expect("watermarks")
            .1
    };
    Offsets {
        stable: end_of("read_committed"),
        end: end_of("read_uncommitted"),
    }
}

/// `kafka-transactions.sh describe-producers` of one partition: one map of columns per
/// producer.
fn tool_describe_producers(topic: &str, partition: i32) -> Vec<BTreeMap<String, String>> {
    let out = std::process::Command::new(testbed::dev_dir().join("kafka.sh"))
        .args([
            "tool",
            "org.apache.kafka.tools.TransactionsCommand",
            "describe-producers",
            "--topic",
            topic,
            "--partition",
            &partition.to_string(),
        ])
        .output()
        .expect("running dev/kafka.sh tool");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kafka-transactions.sh describe-producers failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split('\t')
        .map(|h| h.trim().to_string())
        .collect();
    lines
        .map(|row| {
            header
                .iter()
                .cloned()
                .zip(row.split('\t').map(|v| v.trim().to_string()))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_transaction_is_found_on_its_partition_and_an_abort_marker_ends_it_there() {
    let topic = testbed::unique_name("hanging");
    kafka::create_topic(&topic, 2).await;
    let txn_id = testbed::unique_name("hanging-txn");
    let producer = kafka::transactional_producer(&txn_id);
    producer.begin_transaction().expect("begin");
    for i in 0..3 {
        kafka::send(
            &producer,
            BaseRecord::<str, str>::to(&topic)
                .partition(0)
                .key("k")
                .payload(&format!("open-{i}")),
        );
    }
    producer.flush(TIMEOUT).expect("flush");

    let held = stable_and_end(&topic, 0);
    assert_eq!(
        held,
        Offsets { stable: 0, end: 3 },
        "the open transaction holds readers back"
    );
    let now = Timestamp::now();
    let stuck = StuckSince::default().observe(&BTreeMap::from([((topic.clone(), 0), held)]), now);
    assert_eq!(stuck.suspects(Duration::ZERO, now).len(), 1);

    // The partition's leader, and its producers.
    let mut bootstrap = connect(&kafka::bootstrap());
    let cluster = transactions::leaders(&mut bootstrap, std::slice::from_ref(&topic)).unwrap();
    let leader = &cluster.brokers[&cluster.leaders[&(topic.clone(), 0)]];
    let mut leader = connect(leader);
    let described = transactions::describe_producers(&mut leader, &topic, &[0, 1]).unwrap();
    let producers = described[&0].clone().expect("partition 0's producers");
    assert_eq!(producers.len(), 1, "{producers:?}");
    let open = &producers[0];
    assert_eq!(open.open_transaction_start, Some(0));
    assert_eq!(
        described[&1].as_ref().map(Vec::len),
        Ok(0),
        "nobody wrote to partition 1"
    );
    let tool = tool_describe_producers(&topic, 0);
    assert_eq!(tool.len(), 1, "{tool:?}");
    assert_eq!(tool[0]["ProducerId"], open.producer_id.to_string());
    assert_eq!(tool[0]["ProducerEpoch"], open.producer_epoch.to_string());
    assert_eq!(tool[0]["CurrentTransactionStartOffset"], "0");

    // What the coordinators know of its producer id: every broker is asked.
    let mut listed = Vec::new();
    for address in cluster.brokers.values() {
        listed.extend(
            transactions::list_transactions(&mut connect(address), &[open.producer_id]).unwrap(),
        );
    }
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].transactional_id, txn_id);
    assert_eq!(listed[0].state, "Ongoing");
    let mut coordinator = streamapp_kafka_wire::open_coordinator(
        &[kafka::bootstrap()],
        "hanging-test",
        TIMEOUT,
        &Security::default(),
        streamapp_kafka_wire::CoordinatorKind::Transaction,
        &txn_id,
    )
    .unwrap();
    let coordinator_view = transactions::describe_transaction(&mut coordinator, &txn_id).unwrap();
    assert_eq!(coordinator_view.producer_id, open.producer_id);
    assert_eq!(coordinator_view.partitions, vec![(topic.clone(), 0)]);
    assert_eq!(
        diagnose(
            &open_transaction(open),
            &(topic.clone(), 0),
            Some(&CoordinatorView {
                transactional_id: listed[0].transactional_id.clone(),
                producer_epoch: coordinator_view.producer_epoch,
                state: coordinator_view.state.clone(),
                partitions: coordinator_view.partitions.clone(),
            })
        ),
        Finding::InProgress {
            transactional_id: txn_id.clone()
        },
        "a live producer's transaction is slow, not hanging"
    );

    // The abort marker ends the transaction on the partition: its records are aborted for
    // every read_committed reader, even when the producer commits afterwards.
    transactions::write_abort_marker(&mut leader, &topic, 0, open).unwrap();
    let after = stable_and_end(&topic, 0);
    assert_eq!(
        after.stable, after.end,
        "nothing holds readers back any more"
    );
    let described = transactions::describe_producers(&mut leader, &topic, &[0]).unwrap();
    assert_eq!(
        described[&0].as_ref().unwrap()[0].open_transaction_start,
        None
    );
    producer.commit_transaction(TIMEOUT).expect("commit");
    assert_eq!(
        kafka::read_all(&topic, Isolation::ReadCommitted, |_| {}),
        0,
        "the aborted records stay aborted"
    );
    assert_eq!(
        kafka::read_all(&topic, Isolation::ReadUncommitted, |_| {}),
        3
    );
}

fn open_transaction(p: &PartitionProducer) -> OpenTransaction {
    OpenTransaction {
        producer_id: p.producer_id,
        producer_epoch: p.producer_epoch,
        coordinator_epoch: p.coordinator_epoch,
        start_offset: p.open_transaction_start.expect("open"),
    }
}
