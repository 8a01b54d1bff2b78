//! Proves the local broker is a real Kafka with working transactions.

use std::time::Duration;

use rdkafka::producer::{BaseRecord, Producer};
use testbed::kafka::{self, Isolation};

#[tokio::test]
async fn read_committed_sees_committed_records_only_and_read_uncommitted_sees_all() {
    const COMMITTED: usize = 50;
    const ABORTED: usize = 20;
    let topic = testbed::unique_name("smoke-txn");
    kafka::create_topic(&topic, 2).await;

    let producer = kafka::transactional_producer(&testbed::unique_name("smoke-txn-producer"));
    producer.begin_transaction().unwrap();
    for i in 0..COMMITTED {
        let key = format!("committed-{i}");
        producer
            .send(BaseRecord::to(&topic).key(&key).payload("kept"))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer
        .commit_transaction(Duration::from_secs(30))
        .unwrap();

    producer.begin_transaction().unwrap();
    for i in 0..ABORTED {
        let key = format!("aborted-{i}");
        producer
            .send(BaseRecord::to(&topic).key(&key).payload("dropped"))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    // Make sure the aborted records really reached the log before the abort.
    producer.flush(Duration::from_secs(30)).unwrap();
    producer.abort_transaction(Duration::from_secs(30)).unwrap();

    let mut committed_payloads = Vec::new();
    let committed = kafka::read_all(&topic, Isolation::ReadCommitted, |m| {
        use rdkafka::Message;
        committed_payloads.push(m.payload().unwrap().to_vec());
    });
    assert_eq!(committed, COMMITTED);
    assert!(committed_payloads.iter().all(|p| p == b"kept"));

    let all = kafka::read_all(&topic, Isolation::ReadUncommitted, |_| {});
    assert_eq!(all, COMMITTED + ABORTED);
}

/// `end_offsets` is the end of the log, records of an open transaction included: a check that
/// waits for "everything up to the end" must not stop at another producer's open transaction
/// (a read_committed client's "high watermark" is the last stable offset, which stops there).
#[tokio::test]
async fn end_offsets_are_the_logs_end_past_an_open_transaction() {
    const OPEN: usize = 7;
    let topic = testbed::unique_name("smoke-ends");
    kafka::create_topic(&topic, 1).await;
    let producer = kafka::transactional_producer(&testbed::unique_name("smoke-ends-producer"));
    producer.begin_transaction().unwrap();
    for i in 0..OPEN {
        producer
            .send(
                BaseRecord::to(&topic)
                    .key(&format!("open-{i}"))
                    .payload("pending"),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    assert_eq!(kafka::end_offsets(&topic), vec![OPEN as i64]);
    assert_eq!(kafka::read_all(&topic, Isolation::ReadCommitted, |_| {}), 0);
    producer.abort_transaction(Duration::from_secs(30)).unwrap();
}
