//! Records at the edges of what the processor can take, and configurations it must refuse: a
//! record that cannot be written or processed never stops its partition, one record from the
//! future never switches deduplication off, and what cannot work is refused at start-up,
//! naming the field or topic.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{App, AppOptions, Input, counts, now_ms, serial};

const MINUTE: Duration = Duration::from_secs(60);

fn value_of(size: usize) -> Vec<u8> {
    vec![b'v'; size]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_just_over_a_megabyte_is_dead_lettered_as_metadata_and_the_partition_goes_on() {
    let _serial = serial().await;
    // The default maxValueSize: with the old 1Mi default this value passed the check and then
    // could never be produced (librdkafka's message.max.bytes is 1,000,000).
    let app = App::create(
        "big",
        AppOptions {
            partitions: 1,
            max_value_size: "900k",
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&[
        Input::cmd("before", t0),
        Input {
            key: Some("big".into()),
            value: Some(value_of(1_010_000)),
            time: t0 + 1,
            ..Default::default()
        },
        Input::cmd("after", t0 + 2),
    ]);
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(
        counts(&output),
        [("before".to_string(), 1), ("after".to_string(), 1)].into(),
        "the records around it are processed"
    );
    let dlq = app.read(&app.dead_letters);
    assert_eq!(dlq.len(), 1);
    let d = &dlq[0];
    assert_eq!(d.headers["streamapp.dlq.reason"], "value-too-large");
    assert_eq!(d.headers["streamapp.dlq.original-size"], "1010000");
    assert_eq!(
        d.headers["streamapp.dlq.source"],
        format!("{}/0/1", app.input)
    );
    assert_eq!(
        d.value, None,
        "metadata only: the value is what was too large"
    );
    assert_eq!(d.key, None);
    assert!(p.is_ready(), "the partition goes on");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_the_broker_refuses_as_too_large_is_dead_lettered_after_its_attempts() {
    let _serial = serial().await;
    // The output topic takes exactly a maximal value plus the 64Ki the processor reserves for
    // key and headers; a record with 90k of headers is under maxValueSize but over that.
    let app = App::create(
        "refused",
        AppOptions {
            partitions: 1,
            topic_configs: &[("output", "max.message.bytes", "965536")],
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let mut huge = Input {
        key: Some("huge".into()),
        value: Some(value_of(880_000)),
        time: t0 + 1,
        ..Default::default()
    };
    huge.headers.push(("pad".into(), "h".repeat(90_000)));
    app.produce(&[Input::cmd("before", t0), huge, Input::cmd("after", t0 + 2)]);
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(
        counts(&output).keys().cloned().collect::<HashSet<_>>(),
        HashSet::from(["before".to_string(), "after".to_string()])
    );
    assert_eq!(output.len(), 2);
    let dlq = app.read(&app.dead_letters);
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let d = &dlq[0];
    assert_eq!(d.headers["streamapp.dlq.reason"], "produce-failed");
    assert_eq!(
        d.headers["streamapp.dlq.source"],
        format!("{}/0/1", app.input)
    );
    assert!(
        d.headers["streamapp.dlq.error"].contains("failed 3 attempts"),
        "{:?}",
        d.headers
    );
    assert_eq!(d.value, None, "too large: metadata only");
    assert!(
        !d.headers.contains_key("pad"),
        "not even the original headers"
    );
    assert!(p.is_ready());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_failing_every_attempt_is_dead_lettered_with_its_error_and_counted() {
    let _serial = serial().await;
    let app = App::with_partitions("poison", 1).await;
    let t0 = now_ms();
    // The enrich stage fails every time on records that ask for it: poison pills.
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "fail-after-put=100000")]);
    p.wait_ready(MINUTE);
    let records: Vec<Input> = (0..100)
        .map(|i| {
            let r = Input::cmd(&format!("p-{i}"), t0 + i);
            if i % 20 == 7 {
                r.header("streamapp.fault", "fail-after-put")
            } else {
                r
            }
        })
        .collect();
    app.produce(&records);
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.output).len(), 95);
    let dlq = app.read(&app.dead_letters);
    assert_eq!(
        dlq.iter().map(|d| d.id()).collect::<HashSet<_>>(),
        (0..5)
            .map(|k| format!("p-{}", k * 20 + 7))
            .collect::<HashSet<_>>()
    );
    for d in &dlq {
        assert_eq!(d.headers["streamapp.dlq.reason"], "processing-failed");
        let error = &d.headers["streamapp.dlq.error"];
        assert!(
            error.contains("failed 3 attempts")
                && error.contains("injected failure in the enrich stage"),
            "{error}"
        );
        assert!(d.value.is_some(), "the record itself is kept");
    }
    // Bounded: each poison pill costs its three attempts, alone, and nothing else aborts.
    assert_eq!(
        p.metric("streamapp_processor_transactions_aborted_total"),
        Some(15.0)
    );
    assert_eq!(
        p.metric(r#"streamapp_processor_dead_letters_total{reason="processing-failed"}"#),
        Some(5.0)
    );
    let health = p.live_health();
    assert_eq!(health.dead_letters.get("processing-failed"), Some(&5));
    let last = health.last_dead_letter.expect("the latest dead letter");
    assert_eq!(last.source, format!("{}/0/87", app.input));
    // A dead-lettered record was never put: its id, seen again, is a first occurrence.
    app.produce(&[Input::cmd("p-7", t0 + 200)]);
    app.wait_until_processed(MINUTE);
    assert_eq!(counts(&app.read(&app.output)).get("p-7"), Some(&1));
    assert!(app.read(&app.duplicates).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_stamped_a_century_ahead_is_dead_lettered_and_deduplication_keeps_working() {
    let _serial = serial().await;
    // Kafka 4 refuses records stamped more than an hour ahead by default; older brokers, and
    // topics configured so, take them.
    let app = App::create(
        "future",
        AppOptions {
            partitions: 1,
            topic_configs: &[(
                "input",
                "message.timestamp.after.max.ms",
                "9223372036854775807",
            )],
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let century = 100 * 365 * 24 * 3_600_000;
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let mut records: Vec<Input> = (0..100)
        .map(|i| Input::cmd(&format!("f-{i}"), t0 + i))
        .collect();
    records.push(Input::cmd("from-the-future", t0 + century));
    // Repeats after it: still duplicates, the store kept every id.
    records.extend((0..100).map(|i| Input::cmd(&format!("f-{i}"), t0 + 200 + i)));
    app.produce(&records);
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.output).len(), 100, "each id once");
    assert_eq!(app.read(&app.duplicates).len(), 100, "repeats still found");
    let dlq = app.read(&app.dead_letters);
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        dlq[0].headers["streamapp.dlq.reason"],
        "timestamp-too-far-ahead"
    );
    assert!(
        dlq[0].headers["streamapp.dlq.error"].contains("topology.maxSkew"),
        "{:?}",
        dlq[0].headers
    );
    assert!(p.drain().status.success());
    p.wait_exit(MINUTE);
    let report = common::inspect(&p.state);
    let stream_time = report["tasks"][0]["streamTime"].as_i64().unwrap();
    assert!(
        stream_time < t0 + 3_600_000,
        "stream time {stream_time} stayed near the clock ({t0})"
    );
    assert_eq!(report["tasks"][0]["ids"], 100);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_output_topic_stops_the_processor_at_start_up_naming_the_topic() {
    let _serial = serial().await;
    let app = App::create(
        "nooutput",
        AppOptions {
            partitions: 1,
            without_topics: &["output"],
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start("pod-0");
    p.assert_refused_at_start_up(&format!(
        "topology.outputTopic: topic {} does not exist",
        app.output
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn fifo_compaction_is_refused_at_start_up_naming_the_field() {
    let _serial = serial().await;
    let app = App::create(
        "fifo",
        AppOptions {
            partitions: 1,
            rocksdb: serde_json::json!({ "profile": "LowMemory", "compactionStyle": "Fifo" }),
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start("pod-0");
    p.assert_refused_at_start_up("rocksdb.compactionStyle: Fifo deletes the oldest SST files");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kip_848_consumer_group_protocol_is_refused_naming_the_field() {
    let _serial = serial().await;
    let app = App::create(
        "kip848",
        AppOptions {
            partitions: 1,
            kafka_properties: serde_json::json!({ "group.protocol": "consumer" }),
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start("pod-0");
    p.assert_refused_at_start_up("kafka.properties.group.protocol: is set by the processor");
}
