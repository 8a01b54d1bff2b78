//! Invalid StreamApps are refused by the API server at `kubectl apply`, with the message a user
//! sees. The CRD's schema and CEL rules do this; no operator runs here.

use crate::support;

use support::{install_crd, streamapp_json};
use testbed::kube::{TestNamespace, kubectl};

/// `kubectl apply` of `app` in `ns`: Ok(stdout) or Err(stderr).
fn apply(ns: &str, app: &serde_json::Value) -> Result<String, String> {
    let out = kubectl(&["apply", "-n", ns, "-f", "-"], Some(&app.to_string()));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn with(mut app: serde_json::Value, pointer: &str, value: serde_json::Value) -> serde_json::Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = app
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("{parent} in the sample"));
    target[key] = value;
    app
}

fn assert_refused(ns: &str, app: serde_json::Value, expected: &str) {
    match apply(ns, &app) {
        Ok(out) => {
            panic!("the API server accepted an invalid StreamApp ({out}); expected: {expected}")
        }
        Err(message) => assert!(
            message.contains(expected),
            "expected {expected:?} in:\n{message}"
        ),
    }
}

async fn namespace(prefix: &str) -> TestNamespace {
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    TestNamespace::create(&client, prefix).await
}

#[tokio::test]
async fn a_valid_streamapp_is_accepted() {
    let ns = namespace("valid").await;
    let out = apply(&ns.name, &streamapp_json("ok", 1)).expect("a valid StreamApp is accepted");
    assert!(out.contains("streamapp.streamapp.dev/ok created"), "{out}");
    ns.delete().await;
}

#[tokio::test]
async fn retention_not_greater_than_the_commit_interval_is_refused() {
    let ns = namespace("retention").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/topology/retention",
        "100ms".into(),
    );
    assert_refused(
        &ns.name,
        app,
        "topology.retention must be greater than topology.commitInterval",
    );
    ns.delete().await;
}

#[tokio::test]
async fn the_same_input_and_output_topic_is_refused() {
    let ns = namespace("topics").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/topology/outputTopic",
        "orders".into(),
    );
    assert_refused(
        &ns.name,
        app,
        "topology.inputTopic, topology.outputTopic and topology.deadLetterTopic must be three different topics",
    );
    ns.delete().await;
}

#[tokio::test]
async fn skip_any_corrupted_records_is_refused() {
    let ns = namespace("walmode").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/rocksdb",
        serde_json::json!({ "wal": { "recoveryMode": "SkipAnyCorruptedRecords" } }),
    );
    assert_refused(
        &ns.name,
        app,
        "rocksdb.wal.recoveryMode SkipAnyCorruptedRecords can leave holes in the store",
    );
    ns.delete().await;
}

#[tokio::test]
async fn negative_replicas_are_refused() {
    let ns = namespace("replicas").await;
    let app = with(streamapp_json("a", 1), "/spec/replicas", (-1).into());
    assert_refused(
        &ns.name,
        app,
        "spec.replicas in body should be greater than or equal to 0",
    );
    ns.delete().await;
}

#[tokio::test]
async fn a_header_dedup_id_without_a_header_name_is_refused() {
    let ns = namespace("header").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/topology/dedupId",
        serde_json::json!({ "source": "Header" }),
    );
    assert_refused(
        &ns.name,
        app,
        "topology.dedupId.header is required when topology.dedupId.source is Header",
    );
    ns.delete().await;
}

#[tokio::test]
async fn kafka_properties_the_processor_owns_are_refused() {
    let ns = namespace("props").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/kafka/properties",
        serde_json::json!({ "isolation.level": "read_uncommitted" }),
    );
    assert_refused(
        &ns.name,
        app,
        "kafka.properties must not set isolation.level",
    );
    ns.delete().await;
}

#[tokio::test]
async fn fifo_compaction_is_refused() {
    let ns = namespace("fifo").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/rocksdb",
        serde_json::json!({ "compactionStyle": "Fifo" }),
    );
    assert_refused(
        &ns.name,
        app,
        "rocksdb.compactionStyle Fifo deletes the oldest SST files",
    );
    ns.delete().await;
}

#[tokio::test]
async fn the_kip_848_group_protocol_is_refused() {
    let ns = namespace("kip848").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/kafka/properties",
        serde_json::json!({ "group.protocol": "consumer" }),
    );
    assert_refused(
        &ns.name,
        app,
        "the KIP-848 consumer protocol and cooperative assignors are not supported",
    );
    ns.delete().await;
}

#[tokio::test]
async fn a_max_value_size_the_producer_cannot_send_is_refused_unless_message_max_bytes_allows_it() {
    let ns = namespace("maxvalue").await;
    let big = with(
        streamapp_json("a", 1),
        "/spec/topology/maxValueSize",
        "1Mi".into(),
    );
    assert_refused(
        &ns.name,
        big.clone(),
        "topology.maxValueSize plus 64Ki for key and headers must fit the producer's message.max.bytes",
    );
    let allowed = with(
        big,
        "/spec/kafka/properties",
        serde_json::json!({ "message.max.bytes": "2000000" }),
    );
    apply(&ns.name, &allowed).expect("a larger message.max.bytes makes room");
    ns.delete().await;
}

#[tokio::test]
async fn a_max_skew_not_less_than_the_retention_is_refused() {
    let ns = namespace("skew").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/topology/maxSkew",
        "2h".into(),
    );
    assert_refused(
        &ns.name,
        app,
        "topology.maxSkew must be less than topology.retention",
    );
    ns.delete().await;
}

#[tokio::test]
async fn shrinking_the_storage_on_update_is_refused() {
    let ns = namespace("shrink").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/storage",
        serde_json::json!({ "size": "2Gi" }),
    );
    apply(&ns.name, &app).expect("created with 2Gi");
    let smaller = with(
        app.clone(),
        "/spec/storage",
        serde_json::json!({ "size": "1Gi" }),
    );
    assert_refused(&ns.name, smaller, "storage.size may grow but not shrink");
    let larger = with(app, "/spec/storage", serde_json::json!({ "size": "3Gi" }));
    apply(&ns.name, &larger).expect("growing is allowed");
    ns.delete().await;
}

#[tokio::test]
async fn adding_a_wal_volume_to_an_existing_streamapp_is_refused() {
    let ns = namespace("walvol").await;
    let app = streamapp_json("a", 1);
    apply(&ns.name, &app).expect("created without a WAL volume");
    let with_wal = with(
        app,
        "/spec/storage",
        serde_json::json!({ "size": "1Gi", "walVolume": { "size": "1Gi" } }),
    );
    assert_refused(
        &ns.name,
        with_wal,
        "storage.walVolume cannot be added or removed once the StreamApp exists",
    );
    ns.delete().await;
}

#[tokio::test]
async fn setting_or_changing_the_storage_class_of_an_existing_streamapp_is_refused() {
    let ns = namespace("class").await;
    let app = streamapp_json("a", 1);
    apply(&ns.name, &app).expect("created with the default class");
    let with_class = with(
        app,
        "/spec/storage",
        serde_json::json!({ "size": "1Gi", "storageClassName": "fast" }),
    );
    assert_refused(
        &ns.name,
        with_class,
        "storage.storageClassName cannot change: existing volumes keep their class",
    );
    ns.delete().await;
}

#[tokio::test]
async fn a_topic_name_kafka_refuses_is_refused() {
    let ns = namespace("topicname").await;
    let app = with(
        streamapp_json("a", 1),
        "/spec/topology/outputTopic",
        "orders/out".into(),
    );
    assert_refused(
        &ns.name,
        app,
        "spec.topology.outputTopic in body should match '^[a-zA-Z0-9._-]+$'",
    );
    let app = with(
        streamapp_json("a", 1),
        "/spec/topology/deadLetterTopic",
        "..".into(),
    );
    assert_refused(&ns.name, app, "topic names must not be '.' or '..'");
    ns.delete().await;
}

#[tokio::test]
async fn rocksdb_knobs_rocksdb_cannot_work_with_are_refused() {
    let ns = namespace("knobs").await;
    let cases = [
        (
            serde_json::json!({ "blockSize": "512" }),
            "rocksdb.blockSize must be at least 1Ki",
        ),
        (
            serde_json::json!({ "writeBufferSize": "512Ki" }),
            "rocksdb.writeBufferSize must be at least 1Mi",
        ),
        (
            serde_json::json!({ "writeBufferSize": "64Mi", "memtableBudget": "32Mi" }),
            "rocksdb.memtableBudget must be at least rocksdb.writeBufferSize",
        ),
    ];
    for (rocksdb, expected) in cases {
        let app = with(streamapp_json("a", 1), "/spec/rocksdb", rocksdb);
        assert_refused(&ns.name, app, expected);
    }
    let fine = with(
        streamapp_json("a", 1),
        "/spec/rocksdb",
        serde_json::json!({ "blockSize": "16Ki", "writeBufferSize": "8Mi", "memtableBudget": "64Mi" }),
    );
    apply(&ns.name, &fine).expect("knobs at sensible values are accepted");
    ns.delete().await;
}

#[tokio::test]
async fn standbys_are_refused_with_a_sasl_mechanism_the_membership_does_not_speak() {
    let ns = namespace("standbys").await;
    let standbys = with(streamapp_json("a", 2), "/spec/standbyReplicas", 1.into());
    let message = "standbyReplicas with SASL needs kafka.properties sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512";
    let properties = |p: serde_json::Value| with(standbys.clone(), "/spec/kafka/properties", p);
    assert_refused(
        &ns.name,
        properties(serde_json::json!({ "security.protocol": "SASL_SSL" })),
        message,
    );
    assert_refused(
        &ns.name,
        properties(serde_json::json!({
            "security.protocol": "SASL_SSL", "sasl.mechanisms": "OAUTHBEARER"
        })),
        message,
    );
    let scram = with(
        properties(serde_json::json!({
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"
        })),
        "/spec/kafka/sasl",
        serde_json::json!({ "secretName": "kafka-user" }),
    );
    let scram = with(
        scram,
        "/spec/kafka/tls",
        serde_json::json!({ "secretName": "kafka-ca" }),
    );
    let out = apply(&ns.name, &scram).expect("standbys over TLS with SCRAM are accepted");
    assert!(out.contains("streamapp.streamapp.dev/a created"), "{out}");
    ns.delete().await;
}

#[tokio::test]
async fn a_topic_named_like_an_internal_topic_is_refused() {
    let ns = namespace("internal").await;
    let expected = "are StreamApp's internal topics";
    for (field, topic) in [
        ("outputTopic", format!("{}.a-dedup-changelog", ns.name)),
        (
            "deadLetterTopic",
            format!("{}.a-dedup-repartition", ns.name),
        ),
        ("duplicatesTopic", "shop.orders-dedup-changelog".to_string()),
    ] {
        let app = with(
            streamapp_json("a", 1),
            &format!("/spec/topology/{field}"),
            topic.into(),
        );
        assert_refused(&ns.name, app, expected);
    }
    ns.delete().await;
}

#[tokio::test]
async fn a_disruption_budget_that_allows_no_pod_down_is_refused() {
    let ns = namespace("budget").await;
    let expected = "disruptionBudget.maxUnavailable must allow at least one pod";
    // A string must be a percentage, as a PodDisruptionBudget's is.
    for zero in [
        serde_json::json!(0),
        serde_json::json!("0%"),
        serde_json::json!("1"),
    ] {
        let app = with(
            streamapp_json("a", 1),
            "/spec/disruptionBudget",
            serde_json::json!({ "maxUnavailable": zero }),
        );
        assert_refused(&ns.name, app, expected);
    }
    for fine in [serde_json::json!(2), serde_json::json!("25%")] {
        let app = with(
            streamapp_json("a", 1),
            "/spec/disruptionBudget",
            serde_json::json!({ "maxUnavailable": fine }),
        );
        apply(&ns.name, &app).unwrap_or_else(|e| panic!("{fine} is accepted: {e}"));
    }
    ns.delete().await;
}
