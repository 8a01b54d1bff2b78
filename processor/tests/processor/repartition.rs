//! Deduplication across partitions against the real broker: with an id inside the value or a
//! header and keys unrelated to it, the processor re-keys records by their id through the
//! repartition topic (`topology.repartition: Auto`, the default), so every id is output exactly
//! once whichever partitions its repeats arrive on — also through kill -9 in either stage and an
//! abort in the dedup stage. With `Never` the input is trusted and what is mis-keyed is counted.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{App, AppOptions, Input, Output, counts, inspect, now_ms, serial};

const MINUTE: Duration = Duration::from_secs(60);

/// `ids` distinct commands with 30% repeats, every record keyed by something unrelated to its id
/// (an order id), and each repeat on another partition than the one before it. The id is in
/// the JSON value (`/id`) and in the header `cmd-id`.
fn spread_commands(ids: usize, partitions: i32, t0: i64) -> (Vec<Input>, usize) {
    let mut records = Vec::new();
    let mut repeats = 0;
    for i in 0..ids {
        let id = format!("cmd-{i}");
        let copies: usize = if i % 10 < 3 { 2 } else { 1 };
        for c in 0..copies {
            let mut r = Input::cmd(&id, t0 + i as i64)
                .header("cmd-id", &id)
                .header("trace", &format!("t-{i}-{c}"))
                .partition((i + c) as i32 % partitions);
            r.key = Some(format!("order-{}", (i * 7 + c) % 101));
            records.push(r);
        }
        repeats += copies - 1;
    }
    // Some repeats much later, on yet another partition.
    for i in (0..ids).step_by(50) {
        let id = format!("cmd-{i}");
        let mut r = Input::cmd(&id, t0 + 100_000 + i as i64)
            .header("cmd-id", &id)
            .header("trace", &format!("t-{i}-late"))
            .partition((i as i32 + 2) % partitions);
        r.key = Some(format!("customer-{}", i % 13));
        records.push(r);
        repeats += 1;
    }
    (records, repeats)
}

/// Every id once in the output, every repeat in the duplicates topic, nothing dead-lettered,
/// and each output record is its input record: the original key, value, headers and time.
fn assert_exactly_once(app: &App, records: &[Input], ids: usize, repeats: usize) -> Vec<Output> {
    let output = app.read(&app.output);
    let dups = app.read(&app.duplicates);
    let per_id = counts(&output);
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ids output more than once: {twice:?}");
    assert_eq!(per_id.len(), ids, "every id is output");
    assert_eq!(output.len(), ids, "every id exactly once");
    assert_eq!(
        dups.len(),
        repeats,
        "every repeat goes to the duplicates topic"
    );
    assert!(app.read(&app.dead_letters).is_empty());
    assert_eq!(output.len() + dups.len(), records.len(), "counts add up");
    let by_trace: HashMap<&str, &Input> = records
        .iter()
        .map(|r| {
            let trace = r.headers.iter().find(|(k, _)| k == "trace").unwrap();
            (trace.1.as_str(), r)
        })
        .collect();
    for o in output.iter().chain(&dups) {
        let input = by_trace[o.headers["trace"].as_str()];
        assert_eq!(o.key, input.key, "the original key is carried");
        assert_eq!(o.value, input.value, "the value is carried");
        assert_eq!(o.time, Some(input.time), "the record time is carried");
        assert_eq!(
            o.headers["cmd-id"],
            o.id(),
            "the input's headers are carried"
        );
        assert!(
            !o.headers
                .keys()
                .any(|k| k.starts_with("streamapp.repartition.")),
            "the route stage's headers stay internal: {:?}",
            o.headers
        );
    }
    output
}

/// Stops the processors and returns the ids their stores hold, across pods.
fn stored_ids(processors: Vec<common::Processor>) -> u64 {
    let mut ids = 0;
    for mut p in processors {
        let drained = p.drain();
        assert!(
            drained.status.success(),
            "drain: {}",
            String::from_utf8_lossy(&drained.stderr)
        );
        assert_eq!(p.wait_exit(MINUTE), Some(0));
        ids += inspect(&p.state)["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["ids"].as_u64().unwrap())
            .sum::<u64>();
    }
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_in_the_value_are_deduplicated_whatever_partition_their_repeats_arrive_on() {
    let _serial = serial().await;
    let partitions = 4;
    let app = App::create(
        "rp-json",
        AppOptions {
            partitions,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            ..Default::default()
        },
    )
    .await;
    assert!(app.repartitions(), "Auto is the default");
    let (records, repeats) = spread_commands(3000, partitions, now_ms() - 200_000);
    let mut pods: Vec<_> = (0..3).map(|i| app.start(&format!("pod-{i}"))).collect();
    for p in &mut pods {
        p.wait_ready(MINUTE);
    }
    app.produce(&records);
    app.wait_until_processed(2 * MINUTE);
    assert_exactly_once(&app, &records, 3000, repeats);

    // The repartition topic: one partition per input partition, records keyed by their id,
    // and what the dedup stage committed is purged from it.
    let repartition = app.repartition_topic();
    assert_eq!(
        testbed::kafka::end_offsets(&repartition).len(),
        partitions as usize
    );
    assert_eq!(
        testbed::kafka::topic_config(&repartition, "cleanup.policy")
            .await
            .as_deref(),
        Some("delete")
    );
    let committed = testbed::kafka::committed_offsets(&app.id, &repartition);
    let deadline = std::time::Instant::now() + 2 * MINUTE;
    loop {
        let starts = testbed::kafka::start_offsets(&repartition);
        if starts.iter().zip(&committed).all(|(s, c)| Some(*s) == *c) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the repartition topic was not purged up to the committed offsets {committed:?}: starts {starts:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let metric_sum = |name: &str| -> f64 { pods.iter().filter_map(|p| p.metric(name)).sum() };
    assert_eq!(
        metric_sum("streamapp_processor_records_repartitioned_total"),
        records.len() as f64
    );
    assert_eq!(
        metric_sum("streamapp_processor_miskeyed_records_total"),
        0.0
    );
    assert_eq!(stored_ids(pods), 3000, "the stores hold every id once");
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_in_a_header_are_deduplicated_whatever_partition_their_repeats_arrive_on() {
    let _serial = serial().await;
    let partitions = 3;
    let app = App::create(
        "rp-header",
        AppOptions {
            partitions,
            dedup_id: serde_json::json!({ "source": "Header", "header": "cmd-id" }),
            ..Default::default()
        },
    )
    .await;
    let (records, repeats) = spread_commands(1500, partitions, now_ms() - 200_000);
    let mut pods: Vec<_> = (0..2).map(|i| app.start(&format!("pod-{i}"))).collect();
    for p in &mut pods {
        p.wait_ready(MINUTE);
    }
    app.produce(&records);
    app.wait_until_processed(2 * MINUTE);
    assert_exactly_once(&app, &records, 1500, repeats);
    assert_eq!(stored_ids(pods), 1500);
}

/// kill -9 in the route stage (a record handed to the producer for the repartition topic, its
/// transaction open) and in the dedup stage (a repartitioned record's put staged), and an abort
/// in the dedup stage: exactly once holds, and the aborted put leaves no trace in the store.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_in_either_stage_and_an_abort_in_the_dedup_stage_keep_every_id_exactly_once() {
    let _serial = serial().await;
    let partitions = 2;
    let app = App::create(
        "rp-crash",
        AppOptions {
            partitions,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms() - 200_000;
    let (batch, repeats) = spread_commands(1000, partitions, t0);
    // Records that ask for a fault, keyed by an order id like the rest.
    let special = |id: &str, fault: &str, time: i64| {
        let mut r = Input::cmd(id, time)
            .header("cmd-id", id)
            .header("trace", &format!("t-{id}"))
            .header("streamapp.fault", fault);
        r.key = Some(format!("order-of-{id}"));
        r
    };
    let crash_route = special("crash-route", "crash-after-route", t0 + 1);
    let crash_dedup = special("crash-dedup", "crash-after-put", t0 + 2);
    let fail_dedup = special("fail-dedup", "fail-after-put", t0 + 3);

    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "crash-after-route=1")]);
    p.wait_ready(MINUTE);
    app.produce(&batch[..600]);
    // Route stage: the process dies with the record sent to the repartition topic and its
    // transaction open.
    app.produce(std::slice::from_ref(&crash_route));
    assert_ne!(p.wait_exit(MINUTE), Some(0), "died in the route stage");

    // Dedup stage: the record's repartition write is committed, the process dies with its put
    // staged.
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "crash-after-put=1")]);
    p.wait_ready(2 * MINUTE);
    app.produce(std::slice::from_ref(&crash_dedup));
    assert_ne!(p.wait_exit(MINUTE), Some(0), "died in the dedup stage");

    // An abort in the dedup stage: the enrich stage fails once after the put; the record is
    // tried again on its own and goes through.
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "fail-after-put=1")]);
    p.wait_ready(2 * MINUTE);
    app.produce(std::slice::from_ref(&fail_dedup));
    app.produce(&batch[600..]);
    app.wait_until_processed(2 * MINUTE);
    let mut records = batch;
    records.extend([crash_route, crash_dedup, fail_dedup]);
    let aborted = p
        .metric("streamapp_processor_transactions_aborted_total")
        .expect("the aborted-transactions metric");
    assert!(aborted >= 1.0, "the injected failure aborted a transaction");
    let ids = 1000 + 3;
    assert_exactly_once(&app, &records, ids, repeats);
    let changelog = app.read(&app.changelog());
    let per_id = counts(&changelog);
    assert_eq!(
        changelog.len(),
        ids,
        "one committed changelog record per id: the aborted puts left none"
    );
    assert!(per_id.values().all(|&n| n == 1));
    assert_eq!(
        stored_ids(vec![p]),
        ids as u64,
        "no aborted put in the store"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn never_trusts_the_keying_and_counts_the_records_whose_key_is_not_their_id() {
    let _serial = serial().await;
    let app = App::create(
        "rp-never",
        AppOptions {
            partitions: 2,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            topology: serde_json::json!({ "repartition": "Never" }),
            ..Default::default()
        },
    )
    .await;
    assert!(!app.repartitions());
    let t0 = now_ms();
    // 40 records keyed by their id, 10 keyed by something else.
    let mut records: Vec<Input> = (0..40)
        .map(|i| Input::cmd(&format!("ok-{i}"), t0 + i))
        .collect();
    for i in 0..10 {
        let mut r = Input::cmd(&format!("mis-{i}"), t0 + 100 + i);
        r.key = Some(format!("order-{i}"));
        records.push(r);
    }
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&records);
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.output).len(), 50);
    assert_eq!(
        p.metric("streamapp_processor_miskeyed_records_total"),
        Some(10.0),
        "every record whose key is not its id is counted"
    );
    let health = p.wait_health("the mis-keyed count", MINUTE, |h| h.miskeyed_records == 10);
    assert_eq!(health.miskeyed_records, 10);
    assert!(
        !testbed::kafka::topic_exists(&app.repartition_topic()),
        "Never: no repartition topic"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repartition_topic_with_the_wrong_partition_count_is_a_start_up_error_naming_it() {
    let _serial = serial().await;
    let app = App::create(
        "rp-mismatch",
        AppOptions {
            partitions: 2,
            dedup_id: serde_json::json!({ "source": "Header", "header": "cmd-id" }),
            ..Default::default()
        },
    )
    .await;
    testbed::kafka::create_topic(&app.repartition_topic(), 3).await;
    let mut p = app.start("pod-0");
    p.assert_refused_at_start_up(&format!(
        "repartition topic {} has 3 partitions but input topic {} has 2",
        app.repartition_topic(),
        app.input
    ));
}

/// An input record that carries headers named like the route stage's own (a producer's, or a
/// record copied from another application's repartition topic) cannot forge its original key
/// or source: the route stage drops them, and only its own reach the dedup stage.
#[tokio::test(flavor = "multi_thread")]
async fn input_headers_named_like_the_route_stages_cannot_replace_the_key_or_the_source() {
    let _serial = serial().await;
    let app = App::create(
        "rp-forged",
        AppOptions {
            partitions: 2,
            dedup_id: serde_json::json!({ "source": "Header", "header": "cmd-id" }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let forged = |r: Input| {
        r.header("streamapp.repartition.key", "forged-key")
            .header("streamapp.repartition.source", "forged/0/0")
            .partition(1)
    };
    let mut kept = forged(Input::cmd("a", t0).header("cmd-id", "a"));
    kept.key = Some("order-1".into());
    // No dedup id: a dead letter, which names its source.
    let mut refused = forged(Input::cmd("b", t0));
    refused.key = Some("order-2".into());
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&[kept, refused]);
    app.wait_until_processed(MINUTE);

    let output = app.read(&app.output);
    assert_eq!(output.len(), 1);
    assert_eq!(
        output[0].key.as_deref(),
        Some("order-1"),
        "the input's own key"
    );
    assert!(
        !output[0]
            .headers
            .keys()
            .any(|k| k.starts_with("streamapp.repartition.")),
        "{:?}",
        output[0].headers
    );
    let dead = app.read(&app.dead_letters);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key.as_deref(), Some("order-2"));
    let source = &dead[0].headers["streamapp.dlq.source"];
    assert!(
        source.starts_with(&format!("{}/1/", app.input)),
        "the real source, not the forged one: {source}"
    );
}

/// A transaction that stays open on the repartition topic (another producer's, or one a broker
/// crash left hanging) holds the dedup stage at the topic's last stable offset: the task says
/// where (its health, and a warning with the abort command), and reads on once it ends, every
/// id once.
#[tokio::test(flavor = "multi_thread")]
async fn a_dedup_stage_held_back_by_an_open_transaction_on_the_repartition_topic_says_where() {
    use rdkafka::producer::{BaseRecord, Producer};
    let _serial = serial().await;
    // One partition: every id goes through repartition partition 0.
    let app = App::create(
        "rp-held",
        AppOptions {
            partitions: 1,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(
        &(0..20)
            .map(|i| Input::cmd(&format!("before-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_for_records(&app.output, 20, MINUTE);

    // Someone else's transaction stays open on the repartition topic (librdkafka's default
    // timeout for it: a minute); the route stage's records land behind it.
    let repartition = app.repartition_topic();
    let open_at = testbed::kafka::end_offsets(&repartition)[0];
    let foreign = testbed::kafka::transactional_producer(&format!("{}-foreign", app.id));
    foreign.begin_transaction().unwrap();
    testbed::kafka::send(
        &foreign,
        BaseRecord::to(&repartition)
            .partition(0)
            .key("foreign")
            .payload("not for the dedup stage"),
    );
    foreign.flush(Duration::from_secs(10)).unwrap();
    app.produce(
        &(0..20)
            .map(|i| Input::cmd(&format!("held-{i}"), t0 + 100 + i))
            .collect::<Vec<_>>(),
    );

    let waiting_at = |h: &streamapp_api::health::ProcessorHealth| {
        h.tasks
            .iter()
            .find(|t| t.partition == 0)
            .and_then(|t| t.input_waiting_for_transaction_at)
    };
    p.wait_health("the task says where its input waits", MINUTE, |h| {
        waiting_at(h) == Some(open_at)
    });
    assert_eq!(
        app.read(&app.output).len(),
        20,
        "nothing behind the open transaction is processed"
    );
    let log = p.log_text();
    assert!(
        log.contains(&format!(
            "the dedup stage reads nothing past offset {open_at} of {repartition}/0"
        )) && log.contains(&format!(
            "kafka-transactions.sh abort --topic {repartition} --partition 0 --start-offset {open_at}"
        )),
        "the warning names the partition, the offset and the abort command:\n{}",
        p.log_tail()
    );

    foreign.abort_transaction(Duration::from_secs(10)).unwrap();
    app.wait_for_records(&app.output, 40, MINUTE);
    p.wait_health("the task waits no more", MINUTE, |h| {
        waiting_at(h).is_none()
    });
    assert!(
        p.log_text().contains(&format!(
            "the open transaction at offset {open_at} of {repartition}/0 ended"
        )),
        "{}",
        p.log_tail()
    );
    let output = app.read(&app.output);
    assert_eq!(output.len(), 40);
    assert!(counts(&output).values().all(|&n| n == 1), "every id once");
    p.kill9();
}
