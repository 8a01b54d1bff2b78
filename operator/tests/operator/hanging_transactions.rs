//! The transaction doctor's view of Kafka, against the real broker: an open transaction found
//! on its partition (DescribeProducers, checked against Kafka's own `kafka-transactions.sh
//! describe-producers`), what its coordinator knows of it (ListTransactions,
//! DescribeTransactions), the partition's last stable offset held back by it, and an abort
//! marker written to the partition's leader that ends it there, as `kafka-transactions.sh
//! abort` does; and a real hanging transaction, made deterministically (a transactional write
//! its coordinator never heard of, as clients before KIP-890 could leave), diagnosed as hanging
//! and ended by the abort marker.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer};
use streamapp_api::crd::StreamApp;
use streamapp_kafka_wire::transactions::{self, Leaders, ListedTransaction, PartitionProducer};
use streamapp_operator::transaction_doctor::{
    CoordinatorView, Finding, HangingReason, Offsets, OpenTransaction, StuckSince, diagnose,
    live_transactional_ids,
};
use testbed::hanging_transaction::{connect, coordinator};
use testbed::kafka::{self, Isolation};

const TIMEOUT: Duration = Duration::from_secs(10);

/// What the coordinators know of `producer_id`: the one transactional id every broker's
/// ListTransactions names for it, and that id as its coordinator describes it.
fn what_coordinators_know(
    cluster: &Leaders,
    producer_id: i64,
) -> (ListedTransaction, CoordinatorView) {
    let mut listed = Vec::new();
    for address in cluster.brokers.values() {
        listed.extend(
            transactions::list_transactions(&mut connect(address), &[producer_id]).unwrap(),
        );
    }
    assert_eq!(listed.len(), 1, "{listed:?}");
    let listed = listed.remove(0);
    let mut coordinator = coordinator(&listed.transactional_id);
    let described =
        transactions::describe_transaction(&mut coordinator, &listed.transactional_id).unwrap();
    assert_eq!(described.producer_id, producer_id);
    let view = CoordinatorView {
        transactional_id: listed.transactional_id.clone(),
        producer_epoch: described.producer_epoch,
        state: described.state,
        partitions: described.partitions,
    };
    (listed, view)
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
    kafka::transactions_tool_table(&[
        "describe-producers",
        "--topic",
        topic,
        "--partition",
        &partition.to_string(),
    ])
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

    // What the coordinators know of its producer id.
    let (listed, coordinator_view) = what_coordinators_know(&cluster, open.producer_id);
    assert_eq!(listed.state, "Ongoing");
    assert_eq!(coordinator_view.transactional_id, txn_id);
    assert_eq!(coordinator_view.partitions, vec![(topic.clone(), 0)]);
    assert_eq!(
        diagnose(
            &open_transaction(open),
            &(topic.clone(), 0),
            Some(&coordinator_view)
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

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_its_coordinator_does_not_know_is_hanging_and_the_abort_marker_frees_the_partition()
 {
    let topic = testbed::unique_name("hung");
    kafka::create_topic(&topic, 1).await;
    let mut bootstrap = connect(&kafka::bootstrap());
    let cluster = transactions::leaders(&mut bootstrap, std::slice::from_ref(&topic)).unwrap();
    let leader_address = cluster.brokers[&cluster.leaders[&(topic.clone(), 0)]].clone();
    let txn_id = testbed::hanging_transaction::make(&topic, 0);

    let held = stable_and_end(&topic, 0);
    assert_eq!(
        held,
        Offsets { stable: 0, end: 1 },
        "the hanging transaction holds readers back"
    );
    let mut leader = connect(&leader_address);
    let producers = transactions::describe_producers(&mut leader, &topic, &[0]).unwrap()[&0]
        .clone()
        .unwrap();
    assert_eq!(producers.len(), 1, "{producers:?}");
    let open = &producers[0];
    assert_eq!(open.open_transaction_start, Some(0));
    let (_, described) = what_coordinators_know(&cluster, open.producer_id);
    let finding = diagnose(
        &open_transaction(open),
        &(topic.clone(), 0),
        Some(&described),
    );
    assert_eq!(
        finding,
        Finding::Hanging {
            owner: Some(txn_id.clone()),
            reason: HangingReason::NotInProgress("Empty".into()),
        },
        "its coordinator has no transaction in progress"
    );

    transactions::write_abort_marker(&mut leader, &topic, 0, open).unwrap();
    let after = stable_and_end(&topic, 0);
    assert_eq!(after.stable, after.end, "the partition is free again");
    assert_eq!(kafka::read_all(&topic, Isolation::ReadCommitted, |_| {}), 0);
}

/// The app's events' reasons and notes.
async fn events(client: &kube::Client, ns: &str) -> Vec<(String, String)> {
    kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The note of the first event with `reason` in `ns`, waited for up to a minute.
async fn event_note(client: &kube::Client, ns: &str, reason: &str) -> String {
    support::eventually(Duration::from_secs(60), reason, || async {
        events(client, ns)
            .await
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, note)| note)
    })
    .await
}

/// The topics of a doctor test's app.
struct AppTopics {
    input: String,
    changelog: String,
}

/// A StreamApp `orders` with one pod on the fake node (nothing runs), topics of its own (one
/// partition each) and `kafka` as its `spec.kafka`; the processors' transaction timeout is
/// 2 s, so the doctor's threshold is 4 s.
async fn doctor_app(
    client: &kube::Client,
    ns: &str,
    mut kafka_spec: serde_json::Value,
) -> AppTopics {
    let base = testbed::unique_name("doctor");
    let (input, output, dlq) = (
        format!("{base}-in"),
        format!("{base}-out"),
        format!("{base}-dlq"),
    );
    let changelog = streamapp_api::config::changelog_topic(&format!("{ns}.orders"));
    for t in [&input, &output, &dlq, &changelog] {
        kafka::create_topic(t, 1).await;
    }
    kafka_spec["properties"]["transaction.timeout.ms"] = "2000".into();
    let mut app = support::streamapp_json("orders", 1);
    app["spec"]["kafka"] = kafka_spec;
    app["spec"]["topology"] = serde_json::json!({
        "inputTopic": input, "outputTopic": output, "deadLetterTopic": dlq,
    });
    support::create(client, ns, app).await;
    AppTopics { input, changelog }
}

/// A StreamApp whose changelog partition 0 holds a hanging transaction; `policy`: its
/// `spec.kafka.abortHangingTransactions`. Returns the changelog.
async fn app_with_a_hanging_changelog(client: &kube::Client, ns: &str, policy: &str) -> String {
    let topics = doctor_app(
        client,
        ns,
        serde_json::json!({
            "bootstrapServers": kafka::bootstrap(),
            "abortHangingTransactions": policy,
        }),
    )
    .await;
    testbed::hanging_transaction::make(&topics.changelog, 0);
    topics.changelog
}

/// The message of the app's `TransactionsHealthy` condition once it is `status`/`reason`.
async fn transactions_condition(
    client: &kube::Client,
    ns: &str,
    (status, reason): (&str, &str),
    message: impl Fn(&str) -> bool,
) -> String {
    let found = support::wait_for_status(client, ns, "orders", reason, |s| {
        support::condition(s, "TransactionsHealthy") == Some((status.into(), reason.into()))
            && s.conditions
                .iter()
                .any(|c| c.type_ == "TransactionsHealthy" && message(&c.message))
    })
    .await;
    found
        .conditions
        .into_iter()
        .find(|c| c.type_ == "TransactionsHealthy")
        .map(|c| c.message)
        .unwrap()
}

/// Whether the operator wrote any abort marker for the app (its event says so).
async fn aborted_any(client: &kube::Client, ns: &str) -> bool {
    events(client, ns)
        .await
        .iter()
        .any(|(reason, _)| reason == "HangingTransactionAborted")
}

/// Ends the transaction open on `topic`-`partition` by hand, for the next tests: the broker is
/// shared.
fn abort_by_hand(topic: &str, partition: i32) {
    let mut bootstrap = connect(&kafka::bootstrap());
    let cluster = transactions::leaders(&mut bootstrap, &[topic.to_string()]).unwrap();
    let mut leader = connect(&cluster.brokers[&cluster.leaders[&(topic.to_string(), partition)]]);
    let open = transactions::describe_producers(&mut leader, topic, &[partition]).unwrap()
        [&partition]
        .clone()
        .unwrap()
        .into_iter()
        .find(|p| p.open_transaction_start.is_some())
        .expect("an open transaction");
    transactions::write_abort_marker(&mut leader, topic, partition, &open).unwrap();
}

/// Several of the doctor's looks.
const SEVERAL_LOOKS: Duration =
    Duration::from_secs(3 * streamapp_operator::reconcile::doctor::LOOK_EVERY.as_secs());

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_ends_a_hanging_transaction_on_the_changelog_and_says_so() {
    support::with_operator("doctor-abort", |client, ns| async move {
        let changelog = app_with_a_hanging_changelog(&client, &ns, "IfOwnerGone").await;
        let aborted = event_note(&client, &ns, "HangingTransactionAborted").await;
        assert!(aborted.contains(&format!("on {changelog}/0")), "{aborted}");
        let freed = stable_and_end(&changelog, 0);
        assert_eq!(freed.stable, freed.end, "the partition is free again");
        let status = support::wait_for_status(&client, &ns, "orders", "TransactionsHealthy", |s| {
            support::condition(s, "TransactionsHealthy")
                == Some(("True".into(), "NoHangingTransaction".into()))
        })
        .await;
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "TransactionsHealthy")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_never_the_operator_reports_a_hanging_transaction_and_leaves_it() {
    support::with_operator("doctor-never", |client, ns| async move {
        let changelog = app_with_a_hanging_changelog(&client, &ns, "Never").await;
        let status = support::wait_for_status(&client, &ns, "orders", "HangingTransaction", |s| {
            support::condition(s, "TransactionsHealthy")
                == Some(("False".into(), "HangingTransaction".into()))
        })
        .await;
        let message = status
            .conditions
            .iter()
            .find(|c| c.type_ == "TransactionsHealthy")
            .map(|c| c.message.clone())
            .unwrap();
        assert!(
            message.contains(&format!("{changelog}/0: producer"))
                && message.contains("open since offset 0")
                && message.contains("not ended: spec.kafka.abortHangingTransactions is Never"),
            "{message}"
        );
        let warning = event_note(&client, &ns, "HangingTransaction").await;
        assert!(
            warning.contains(&format!(
                "abort --topic {changelog} --partition 0 --start-offset 0"
            )),
            "the event gives the command: {warning}"
        );
        // Several looks later it is still there, and nothing ended it.
        tokio::time::sleep(SEVERAL_LOOKS).await;
        let held = stable_and_end(&changelog, 0);
        assert_eq!(held, Offsets { stable: 0, end: 1 });
        assert!(!aborted_any(&client, &ns).await);
        abort_by_hand(&changelog, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_transaction_open_longer_than_the_threshold_is_slow_and_left_alone() {
    support::with_operator("doctor-slow", |client, ns| async move {
        let topics = doctor_app(
            &client,
            &ns,
            serde_json::json!({ "bootstrapServers": kafka::bootstrap() }),
        )
        .await;
        transactions_condition(&client, &ns, ("True", "NoHangingTransaction"), |_| true).await;
        // A producer that stalls within its own (longer) transaction timeout, on the changelog,
        // where a hanging transaction would be ended.
        let producer = kafka::transactional_producer(&testbed::unique_name("slow-txn"));
        producer.begin_transaction().expect("begin");
        kafka::send(
            &producer,
            BaseRecord::<str, str>::to(&topics.changelog)
                .partition(0)
                .key("k")
                .payload("slow"),
        );
        producer.flush(TIMEOUT).expect("flush");
        let opened = tokio::time::Instant::now();

        // Past the threshold (4 s) by several looks, it is still open, and nobody ended it.
        tokio::time::sleep(Duration::from_secs(4) + SEVERAL_LOOKS).await;
        assert_eq!(
            stable_and_end(&topics.changelog, 0),
            Offsets { stable: 0, end: 1 },
            "the transaction is still open"
        );
        assert!(!aborted_any(&client, &ns).await);
        let status = support::wait_for_status(&client, &ns, "orders", "the status", |_| true).await;
        assert_eq!(
            support::condition(&status, "TransactionsHealthy"),
            Some(("True".into(), "NoHangingTransaction".into())),
            "{:?}",
            status.conditions
        );
        assert!(
            opened.elapsed() < Duration::from_secs(50),
            "the producer's own timeout (60 s) has not passed"
        );
        producer.commit_transaction(TIMEOUT).expect("commit");
        assert_eq!(
            kafka::read_all(&topics.changelog, Isolation::ReadCommitted, |_| {}),
            1,
            "its record is committed, not aborted"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hanging_transactions_of_a_running_pod_and_of_another_apps_producer_are_shown_never_ended()
{
    support::with_operator("doctor-owned", |client, ns| async move {
        let topics = doctor_app(
            &client,
            &ns,
            serde_json::json!({
                "bootstrapServers": kafka::bootstrap(),
                "abortHangingTransactions": "IfOwnerGone",
            }),
        )
        .await;
        // The pod runs (on the fake node): its transactional id is a live one.
        support::eventually(Duration::from_secs(60), "pod orders-0", || async {
            support::object::<k8s_openapi::api::core::v1::Pod>(&client, &ns, "orders-0").await
        })
        .await;
        let app = support::object::<StreamApp>(&client, &ns, "orders")
            .await
            .unwrap();
        let pods_id = live_transactional_ids(&app, &["orders-0".to_string()]).remove(0);
        // One on the changelog, by the running pod's transactional id; one on the input topic
        // (shared with other producers) by a transactional id that is not the app's.
        testbed::hanging_transaction::make_as(&topics.changelog, 0, &pods_id);
        testbed::hanging_transaction::make(&topics.input, 0);

        let message = transactions_condition(&client, &ns, ("False", "HangingTransaction"), |m| {
            m.contains(&format!("{}/0", topics.changelog))
                && m.contains(&format!("{}/0", topics.input))
        })
        .await;
        assert!(
            message.contains(&format!("{}/0: producer", topics.changelog))
                && message.contains("not ended: its producer is a running pod of this app"),
            "{message}"
        );
        assert!(
            message.contains("not ended: the topic is not one of the app's internal topics"),
            "{message}"
        );
        tokio::time::sleep(SEVERAL_LOOKS).await;
        for topic in [&topics.changelog, &topics.input] {
            assert_eq!(
                stable_and_end(topic, 0),
                Offsets { stable: 0, end: 1 },
                "{topic} is still held"
            );
        }
        assert!(!aborted_any(&client, &ns).await);
        abort_by_hand(&topics.changelog, 0);
        abort_by_hand(&topics.input, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_read_on_a_topic_the_doctor_names_the_permission_and_ends_the_transaction_once_given()
 {
    support::with_operator("doctor-acl", |client, ns| async move {
        let listener = kafka::secure_listener();
        let secrets = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
        for secret in [
            serde_json::json!({
                "metadata": { "name": "kafka-user" },
                "stringData": { "username": listener.username, "password": listener.password },
            }),
            serde_json::json!({
                "metadata": { "name": "kafka-ca" },
                "stringData": { "ca.crt": std::fs::read_to_string(&listener.ca_file).unwrap() },
            }),
        ] {
            secrets
                .create(&Default::default(), &serde_json::from_value(secret).unwrap())
                .await
                .unwrap();
        }
        let topics = doctor_app(
            &client,
            &ns,
            serde_json::json!({
                "bootstrapServers": listener.bootstrap,
                "properties": { "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256" },
                "sasl": { "secretName": "kafka-user" },
                "tls": { "secretName": "kafka-ca" },
            }),
        )
        .await;
        let changelog = topics.changelog;
        // An ACL on the changelog: the app's user may describe it, not read it.
        let user = format!("User:{}", listener.username);
        kafka::allow(&user, &["Describe", "DescribeConfigs"], &changelog);
        testbed::hanging_transaction::make(&changelog, 0);

        let message = transactions_condition(&client, &ns, ("Unknown", "TransactionsUnchecked"), |m| {
            m.contains("not authorised")
        })
        .await;
        assert!(
            message.contains(&format!(
                "describing the producers of {changelog}-0: not authorised; the principal needs \
                 Read on topic {changelog} (DescribeProducers)"
            )),
            "{message}"
        );
        assert!(!aborted_any(&client, &ns).await);

        // Given the permission, the next looks find the transaction and end it.
        kafka::allow(&user, &["Read"], &changelog);
        let aborted = event_note(&client, &ns, "HangingTransactionAborted").await;
        assert!(aborted.contains(&format!("on {changelog}/0")), "{aborted}");
        transactions_condition(&client, &ns, ("True", "NoHangingTransaction"), |_| true).await;
        let freed = stable_and_end(&changelog, 0);
        assert_eq!(freed.stable, freed.end, "the partition is free again");
    })
    .await;
}
