//! The world around the processor misbehaving: a full state volume, a changelog recreated
//! behind its back or with a stale retention, a transaction outliving its timeout, a zombie on
//! another pod, a broker crash. The processor must recover by itself, without quarantining
//! healthy stores, exiting as fenced, or losing and doubling anything.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{App, AppOptions, Input, SmallVolume, counts, now_ms, serial, wait_for_log};
use streamapp_api::health::{StoreOpen, StoreUnavailable, TaskState};

const MINUTE: Duration = Duration::from_secs(60);

fn ids(prefix: &str, range: std::ops::Range<i64>, at: i64) -> Vec<Input> {
    range
        .map(|i| Input::cmd(&format!("{prefix}-{i}"), at + i))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_backs_off_without_quarantining_and_resumes_with_the_same_store() {
    let _serial = serial().await;
    let app = App::with_partitions("diskfull", 1).await;
    let t0 = now_ms();
    let volume = SmallVolume::new(&app.state_dir("pod-0"), "48m");
    let mut p = app.start_in("pod-0", &[], &volume.prefix());
    p.wait_ready(MINUTE);
    app.produce(&ids("d", 0..200, t0));
    app.wait_until_processed(MINUTE);
    p.kill9();

    // The volume fills up while the processor is away; its healthy store must stay put.
    let filler = volume.fill();
    let mut p = app.start_in("pod-0", &[], &volume.prefix());
    let health = p.wait_health("a store backing off on a full disk", MINUTE, |h| {
        h.tasks.iter().any(|t| {
            t.backoff
                .as_ref()
                .is_some_and(|b| b.kind == StoreUnavailable::DiskFull)
        })
    });
    let task = &health.tasks[0];
    assert_eq!(task.state, Some(TaskState::BackingOff));
    assert!(task.quarantines.is_empty(), "nothing quarantined");
    let (status, body) = p.get("/readyz").unwrap();
    assert_eq!(status, 503);
    assert!(body.contains("partition 0 backs off (DiskFull"), "{body}");
    assert_eq!(
        p.metric(r#"streamapp_processor_tasks_backing_off{kind="DiskFull"}"#),
        Some(1.0)
    );
    let quarantine = volume.outside(&app.state_dir("pod-0").join("quarantine"));
    assert!(
        std::fs::read_dir(&quarantine).map_or(true, |mut d| d.next().is_none()),
        "no quarantined copy on the volume"
    );
    assert!(p.is_running(), "backing off, not crash-looping");

    // Space again: the same store opens, replays its tail and goes on.
    std::fs::remove_file(filler).unwrap();
    p.wait_ready(2 * MINUTE);
    let health = p.live_health();
    let task = &health.tasks[0];
    assert_eq!(task.opened, Some(StoreOpen::ReplayedTail), "the same store");
    assert!(task.backoff.is_none() && task.quarantines.is_empty());
    let mut again = ids("d", 0..200, t0 + 1000);
    again.push(Input::cmd("fresh", t0 + 2000));
    app.produce(&again);
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.output).len(), 201, "the store kept every id");
    assert_eq!(app.read(&app.duplicates).len(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recreated_changelog_is_detected_and_the_store_rebuilt_from_it_not_mixed_with_it() {
    let _serial = serial().await;
    let app = App::with_partitions("recreated", 1).await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids("r", 0..100, t0));
    app.wait_until_processed(MINUTE);
    assert!(p.drain().status.success());
    p.wait_exit(MINUTE);

    // The changelog is deleted (and recreated, empty, by the processor at start-up): the store
    // has applied offsets past the new log's end.
    testbed::kafka::delete_topic(&app.changelog()).await;
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let health = p.health();
    let task = &health.tasks[0];
    assert_eq!(task.opened, Some(StoreOpen::Rebuilt));
    assert_eq!(task.quarantines.len(), 1, "the old store is kept");
    assert!(
        task.quarantines[0].reason.contains("the topic now has id"),
        "the store knows the topic id of its changelog: {}",
        task.quarantines[0].reason
    );
    // The store now follows the new changelog: the ids only the old one knew are forgotten
    // (so they are output again), and from then on deduplicated.
    app.produce(&ids("r", 0..100, t0 + 1000));
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.output).len(), 200);
    app.produce(&ids("r", 0..100, t0 + 2000));
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.output).len(), 200);
    assert_eq!(app.read(&app.duplicates).len(), 100);
    assert_eq!(
        app.read(&app.changelog()).len(),
        100,
        "the new changelog holds the ids since"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_changelog_retention_follows_the_topology_retention_when_it_changes() {
    let _serial = serial().await;
    let mut app = App::create(
        "retain",
        AppOptions {
            partitions: 1,
            retention: "10m",
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    p.kill9();
    let day = 86_400_000;
    assert_eq!(
        testbed::kafka::topic_config(&app.changelog(), "retention.ms").await,
        Some((600_000 + day).to_string())
    );
    app.rewrite_config(|c| c["topology"]["retention"] = "2h".into());
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    assert_eq!(
        testbed::kafka::topic_config(&app.changelog(), "retention.ms").await,
        Some((7_200_000 + day).to_string()),
        "a rebuild must still find every id of the longer window"
    );
    assert_eq!(
        testbed::kafka::topic_config(&app.changelog(), "cleanup.policy").await,
        Some("compact,delete".into())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_outliving_its_timeout_is_recovered_without_exiting_as_fenced() {
    let _serial = serial().await;
    // transaction.timeout.ms is 10 s (the harness); the stage takes 20 s.
    let app = App::with_partitions("txntimeout", 1).await;
    let t0 = now_ms();
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "stall-after-put=1")]);
    p.wait_ready(MINUTE);
    app.produce(&[
        Input::cmd("before", t0),
        Input::cmd("slow", t0 + 1).header("streamapp.fault", "stall-after-put:20000"),
        Input::cmd("after", t0 + 2),
    ]);
    app.wait_until_processed(2 * MINUTE);
    assert!(p.is_running(), "not exited:\n{}", p.log_tail());
    let output = app.read(&app.output);
    assert_eq!(output.len(), 3, "{output:?}");
    assert!(counts(&output).values().all(|&n| n == 1));
    assert!(app.read(&app.duplicates).is_empty());
    let log = p.log_text();
    assert!(
        log.contains("outlived transaction.timeout.ms"),
        "{}",
        p.log_tail()
    );
    assert!(
        !log.contains("fenced: another processor"),
        "{}",
        p.log_tail()
    );
    assert_eq!(
        p.metric("streamapp_processor_transaction_timeouts_total"),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_stopped_past_its_timeouts_writes_nothing_visible_and_rejoins() {
    let _serial = serial().await;
    let app = App::with_partitions("zombie", 2).await;
    let t0 = now_ms();
    let mut a = app.start_with("pod-a", &[("STREAMAPP_FAULTS", "stall-after-put=1")]);
    a.wait_ready(MINUTE);
    let mut b = app.start("pod-b");
    b.wait_ready(2 * MINUTE);
    a.wait_ready(MINUTE);
    assert_eq!(
        a.live_health()
            .tasks
            .iter()
            .map(|t| t.partition)
            .collect::<Vec<_>>(),
        [0],
        "the range assignor gives A partition 0"
    );
    app.produce(&[
        Input::cmd("warm-0", t0).partition(0),
        Input::cmd("warm-1", t0).partition(1),
    ]);
    app.wait_until_processed(MINUTE);

    // A stops in the middle of a transaction: the put of z staged, its changelog record sent.
    app.produce(&[Input::cmd("z", t0 + 1)
        .partition(0)
        .header("streamapp.fault", "stall-after-put:2000")]);
    wait_for_log(&a, "stalling the enrich stage", MINUTE);
    a.signal("STOP");
    // B takes partition 0 once A's session expired, and restores it once the coordinator has
    // aborted A's transaction on its timeout.
    b.wait_health("both partitions active on B", 2 * MINUTE, |h| {
        h.tasks.len() == 2 && h.tasks.iter().all(|t| t.state == Some(TaskState::Active))
    });
    app.produce(&ids("during", 0..100, t0 + 10));
    app.wait_until_processed(MINUTE);

    a.signal("CONT");
    // A finds its transaction gone and its membership expired: it rejoins.
    wait_for_log(&a, "outlived transaction.timeout.ms", MINUTE);
    a.wait_ready(2 * MINUTE);
    b.wait_ready(MINUTE);
    app.produce(&ids("after", 0..100, t0 + 200));
    app.wait_until_processed(2 * MINUTE);
    assert!(a.is_running() && b.is_running());
    assert!(!a.log_text().contains("fenced: another processor"));

    let output = app.read(&app.output);
    let distinct: HashSet<String> = output.iter().map(|o| o.id()).collect();
    assert_eq!(
        distinct.len(),
        203,
        "warm-0, warm-1, z, 100 during, 100 after"
    );
    assert_eq!(output.len(), 203, "each once");
    let changelog = app.read(&app.changelog());
    assert_eq!(
        changelog.len(),
        203,
        "the zombie's put of z never became visible"
    );
    assert!(counts(&changelog).values().all(|&n| n == 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn processors_recover_by_themselves_from_a_broker_crash_and_exactly_once_holds() {
    let _serial = serial().await;
    let app = App::with_partitions("brokercrash", 2).await;
    let t0 = now_ms();
    let mut a = app.start("pod-a");
    let mut b = app.start("pod-b");
    a.wait_ready(2 * MINUTE);
    b.wait_ready(2 * MINUTE);
    app.produce(&ids("k", 0..500, t0));
    // Mid-traffic: the processors are working on those 500.
    testbed::kafka::kill_and_restart_broker();
    the_broker_back_every_id_is_output_once(&app, t0, &mut [&mut a, &mut b]);
}

/// After `k-0..500` at `t0` and a broker restart: 300 more ids and 200 repeats are processed
/// by the processors still running, every id once, every repeat a duplicate.
fn the_broker_back_every_id_is_output_once(
    app: &App,
    t0: i64,
    processors: &mut [&mut common::Processor],
) {
    let mut more = ids("k", 500..800, t0);
    more.extend(ids("k", 0..200, t0 + 1000)); // repeats
    app.produce(&more);
    app.wait_until_processed(3 * MINUTE);
    for p in processors.iter_mut() {
        assert!(p.is_running(), "{}", p.log_tail());
    }
    let output = app.read(&app.output);
    assert_eq!(output.len(), 800, "every id once");
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(app.read(&app.duplicates).len(), 200, "nothing lost");
}

/// A dead instance's open transaction holds back the restore of its tasks (and read_committed
/// readers of its outputs) until the coordinator aborts it: the processor asks for 10 s, as
/// Kafka Streams does under exactly-once, unless the user sets `transaction.timeout.ms`.
#[tokio::test(flavor = "multi_thread")]
async fn transactions_time_out_after_10_s_unless_the_user_sets_another_timeout() {
    let _serial = serial().await;
    let mut app = App::with_partitions("txntimeout", 1).await;
    app.rewrite_config(|c| {
        c["kafka"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("transaction.timeout.ms");
    });
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    assert_eq!(
        testbed::kafka::transaction_timeout_ms(&format!("{}-pod-0", app.id)),
        10_000
    );
    p.kill9();
    app.rewrite_config(|c| c["kafka"]["properties"]["transaction.timeout.ms"] = "25000".into());
    let mut p = app.start("pod-1");
    p.wait_ready(MINUTE);
    assert_eq!(
        testbed::kafka::transaction_timeout_ms(&format!("{}-pod-1", app.id)),
        25_000
    );
    p.kill9();
}

/// Restores run side by side through one reader: a changelog partition held back by another
/// producer's open transaction does not keep the other partitions from restoring and
/// processing meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_held_back_by_an_open_transaction_does_not_hold_back_the_other_partitions() {
    use rdkafka::producer::{BaseRecord, Producer};
    let _serial = serial().await;
    let app = App::with_partitions("restorewait", 2).await;
    let t0 = now_ms();
    let on = |p: i32, prefix: &str| -> Vec<Input> {
        (0..50)
            .map(|i| Input::cmd(&format!("{prefix}-{p}-{i}"), t0 + i).partition(p))
            .collect()
    };
    let mut a = app.start("pod-a");
    a.wait_ready(MINUTE);
    app.produce(&[on(0, "r"), on(1, "r")].concat());
    app.wait_until_processed(MINUTE);
    a.kill9();

    // Someone else's transaction stays open on changelog partition 0 (librdkafka's default
    // timeout for it: a minute), from the partition's end on.
    let open_at = testbed::kafka::end_offsets(&app.changelog())[0];
    let foreign = testbed::kafka::transactional_producer(&format!("{}-foreign", app.id));
    foreign.begin_transaction().unwrap();
    let time = t0.to_be_bytes();
    testbed::kafka::send(
        &foreign,
        BaseRecord::to(&app.changelog())
            .partition(0)
            .key("foreign")
            .payload(&time[..]),
    );
    foreign.flush(Duration::from_secs(10)).unwrap();

    // A new pod without state restores both partitions: 1 goes active, 0 waits.
    let mut b = app.start("pod-b");
    let state = |h: &streamapp_api::health::ProcessorHealth, p: i32| {
        h.tasks
            .iter()
            .find(|t| t.partition == p)
            .and_then(|t| t.state)
    };
    b.wait_health("partition 1 active while partition 0 waits", MINUTE, |h| {
        state(h, 1) == Some(TaskState::Active) && state(h, 0) == Some(TaskState::Restoring)
    });
    app.produce(&[Input::cmd("while-waiting", t0 + 100).partition(1)]);
    app.wait_for_records(&app.output, 101, MINUTE);
    wait_for_log(&b, "waiting for an open transaction", MINUTE);
    assert_eq!(
        state(&b.health(), 0),
        Some(TaskState::Restoring),
        "partition 0 still waits for the open transaction"
    );
    let waiting_at = |h: &streamapp_api::health::ProcessorHealth, p: i32| {
        h.tasks
            .iter()
            .find(|t| t.partition == p)
            .and_then(|t| t.restore.as_ref())
            .and_then(|r| r.waiting_for_transaction_at)
    };
    assert_eq!(
        waiting_at(&b.health(), 0),
        Some(open_at),
        "the restore says where the transaction it waits for starts"
    );
    assert!(
        b.log_text().contains(&format!(
            "waiting for an open transaction to end on {}/0, at offset {open_at}",
            app.changelog()
        )),
        "the warning names the partition and the offset"
    );

    foreign.abort_transaction(Duration::from_secs(10)).unwrap();
    b.wait_ready(MINUTE);
    assert!(
        b.log_text()
            .contains("open transaction on the changelog ended")
    );
    assert_eq!(waiting_at(&b.health(), 0), None, "it waits no more");
    let mut again = [on(0, "r"), on(1, "r")].concat();
    again.push(Input::cmd("fresh", t0 + 200).partition(0));
    app.produce(&again);
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(
        output.len(),
        102,
        "100 ids, while-waiting and fresh, each once"
    );
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(
        app.read(&app.duplicates).len(),
        100,
        "both restored stores remember every committed id"
    );
    b.kill9();
}

/// The changelog records of `id` (key), as a read_uncommitted reader sees them: the values.
fn changelog_values(app: &App, id: &str) -> Vec<Option<Vec<u8>>> {
    use rdkafka::message::Message;
    let mut values = Vec::new();
    testbed::kafka::read_all(
        &app.changelog(),
        testbed::kafka::Isolation::ReadUncommitted,
        |m| {
            if m.key() == Some(id.as_bytes()) {
                values.push(m.payload().map(<[u8]>::to_vec));
            }
        },
    );
    values
}

/// A late first occurrence (older than the stored sighting by more than the retention) is
/// output, and the store keeps the later sighting. Compaction keeps only an id's last
/// changelog record, so that record must say what the store keeps: a store rebuilt from the
/// compacted changelog then calls a repeat inside the window a duplicate, as the live one does.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_rebuilt_from_a_compacted_changelog_decides_as_the_live_store_did() {
    let _serial = serial().await;
    let app = App::create(
        "compacted",
        AppOptions {
            partitions: 1,
            retention: "1h",
            ..Default::default()
        },
    )
    .await;
    // The changelog made ready for compaction soon: tiny time-based segments, any dirt cleaned
    // (the processor keeps topic-level configs it does not own).
    testbed::kafka::create_topic_with(
        &app.changelog(),
        1,
        &[
            ("cleanup.policy", "compact,delete"),
            ("segment.ms", "500"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    )
    .await;
    let hour = 3_600_000;
    let now = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&[Input::cmd("x", now)]);
    app.wait_until_processed(MINUTE);
    app.produce(&[Input::cmd("x", now - 2 * hour)]);
    app.wait_until_processed(MINUTE);
    assert_eq!(
        counts(&app.read(&app.output))["x"],
        2,
        "two hours late is outside the window: a first occurrence"
    );
    // A later record rolls the segment holding x's two records, so the cleaner may take it.
    std::thread::sleep(Duration::from_millis(600));
    app.produce(&[Input::cmd("roll", now)]);
    app.wait_until_processed(MINUTE);
    p.drain_and_exit();

    let deadline = std::time::Instant::now() + 2 * MINUTE;
    let kept = loop {
        let values = changelog_values(&app, "x");
        if values.len() == 1 {
            break values[0].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broker did not compact the changelog: x has {} records",
            values.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let kept = streamapp_processor::store::Sighting::decode(&kept.expect("a value"), None);
    let source = streamapp_processor::store::Source {
        topic: app.input.as_str().into(),
        partition: 0,
        offset: 0,
    };
    assert_eq!(
        kept,
        Some(streamapp_processor::store::Sighting {
            time: now,
            source: Some(source)
        }),
        "x's last changelog record carries the sighting the store kept: the first x's time \
         and source, not the late one's"
    );

    // A new pod with an empty volume rebuilds the store from the compacted changelog.
    let mut q = app.start("pod-1");
    q.wait_ready(MINUTE);
    app.produce(&[Input::cmd("x", now + 1000)]);
    app.wait_until_processed(MINUTE);
    assert_eq!(
        counts(&app.read(&app.output))["x"],
        2,
        "a repeat inside the window is not output again after the rebuild"
    );
    assert_eq!(counts(&app.read(&app.duplicates))["x"], 1);
}

/// Records the processor never writes to its changelog do not stop a restore: a key without a
/// value (a tombstone written by hand) forgets the id; a record without a key, or with a value
/// that is not an 8-byte time, is skipped, counted in the metric and the health report.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_forgets_tombstoned_ids_and_skips_and_counts_records_it_cannot_read() {
    let _serial = serial().await;
    let app = App::with_partitions("malformed", 1).await;
    let now = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids("m", 0..3, now));
    app.wait_until_processed(MINUTE);
    p.drain_and_exit();

    // Written by hand, as an operator might: a tombstone for m-1, and two records the
    // processor cannot read. (A record without a key cannot be written at all: the broker
    // refuses it on a compacted topic.)
    let producer: rdkafka::producer::BaseProducer =
        testbed::kafka::input_producer_config().create().unwrap();
    let changelog = app.changelog();
    let before = testbed::kafka::end_offsets(&changelog)[0];
    testbed::kafka::send(
        &producer,
        rdkafka::producer::BaseRecord::<[u8], [u8]>::to(&changelog).key(b"m-1"),
    );
    testbed::kafka::send(
        &producer,
        rdkafka::producer::BaseRecord::<[u8], [u8]>::to(&changelog)
            .key(b"junk")
            .payload(b"abc"),
    );
    testbed::kafka::send(
        &producer,
        rdkafka::producer::BaseRecord::<[u8], [u8]>::to(&changelog)
            .key(b"m-2")
            .payload(b"not a time"),
    );
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).unwrap();
    assert_eq!(
        testbed::kafka::end_offsets(&changelog)[0],
        before + 3,
        "the broker took the three records"
    );

    // A new pod restores the whole changelog: it gets through, and says what it skipped.
    let mut q = app.start("pod-1");
    let health = q.wait_health("its task active", MINUTE, |h| {
        h.tasks.iter().any(|t| t.state == Some(TaskState::Active))
    });
    assert_eq!(health.skipped_changelog_records, 2, "{health:?}");
    assert!(
        health
            .last_skipped_changelog_record
            .as_deref()
            .is_some_and(|r| r.starts_with("0/") && r.contains("8-byte time")),
        "{:?}",
        health.last_skipped_changelog_record
    );
    assert_eq!(
        q.metric("streamapp_processor_changelog_records_skipped_total"),
        Some(2.0)
    );
    assert!(!q.log_text().contains("engine failed"), "{}", q.log_tail());
    assert!(
        q.log_text()
            .contains("the store is empty: restoring it in sorted runs ingested as files"),
        "a new pod's store is restored in runs ingested as files (store/ingest.rs): {}",
        q.log_tail()
    );

    // m-0 and m-2 are remembered (m-2's unreadable record changed nothing); m-1 is forgotten.
    app.produce(&ids("m", 0..3, now + 1000));
    app.wait_until_processed(MINUTE);
    let output = counts(&app.read(&app.output));
    assert_eq!(
        (output["m-0"], output["m-1"], output["m-2"]),
        (1, 2, 1),
        "only the tombstoned id is output again"
    );
}

/// A broker that restarts for a while is waited out by the changelog readers (restores and
/// standbys) as by the rest of the processor: no engine restart (which would drop staged
/// writes and rebalance the whole group), and every id still once.
#[tokio::test(flavor = "multi_thread")]
async fn standbys_wait_out_a_broker_restart_without_restarting_the_engine() {
    let _serial = serial().await;
    let app = App::create(
        "brokerrestart",
        AppOptions {
            partitions: 2,
            extra: serde_json::json!({ "group": { "standbyReplicas": 1 } }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut a = app.start("pod-a");
    let mut b = app.start("pod-b");
    a.wait_ready(2 * MINUTE);
    b.wait_ready(2 * MINUTE);
    app.produce(&ids("k", 0..500, t0));
    app.wait_until_processed(2 * MINUTE);
    for p in [&mut a, &mut b] {
        p.wait_health("a standby", MINUTE, |h| {
            h.tasks.iter().any(|t| t.state == Some(TaskState::Standby))
        });
    }

    testbed::kafka::restart_broker_cleanly();
    the_broker_back_every_id_is_output_once(&app, t0, &mut [&mut a, &mut b]);
    for p in [&a, &b] {
        assert!(
            !p.log_text().contains("engine failed; restarting it"),
            "{} restarted its engine for a broker restart:\n{}",
            p.pod,
            p.log_tail()
        );
    }
}

/// A zombie stopped past its transaction timeout while another instance of the same pod took
/// over: when it runs again its fence looks like a timeout by age, but the transaction
/// coordinator shows the id moved on. The zombie exits as fenced; the live instance is never
/// fenced in turn, and every id is output once.
#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_replaced_by_an_instance_of_the_same_pod_exits_and_never_fences_it() {
    let _serial = serial().await;
    let app = App::with_partitions("samepod", 1).await;
    let t0 = now_ms();
    let mut zombie = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "stall-after-put=1")]);
    zombie.wait_ready(MINUTE);
    app.produce(&[Input::cmd("warm", t0)]);
    app.wait_until_processed(MINUTE);

    // Stopped in the middle of a transaction: z's put staged, its changelog record sent.
    app.produce(&[Input::cmd("z", t0 + 1).header("streamapp.fault", "stall-after-put:2000")]);
    wait_for_log(&zombie, "stalling the enrich stage", MINUTE);
    zombie.signal("STOP");
    let stopped = std::time::Instant::now();

    // The same pod again, elsewhere (another state volume): it fences the stopped one.
    let elsewhere = app.dir.path().join("pod-0-elsewhere");
    let mut live = app.start_at("pod-0", &elsewhere, &[], &[]);
    live.wait_ready(2 * MINUTE);
    app.produce(&ids("during", 0..100, t0 + 10));
    app.wait_until_processed(2 * MINUTE);

    // Past the transaction timeout (10 s): by age alone the zombie's fence reads as one.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(stopped.elapsed()));
    zombie.signal("CONT");
    assert_eq!(
        zombie.wait_exit(MINUTE),
        Some(3),
        "the zombie exits as fenced:\n{}",
        zombie.log_tail()
    );
    app.produce(&ids("after", 0..100, t0 + 200));
    app.wait_until_processed(2 * MINUTE);
    assert!(live.is_running(), "{}", live.log_tail());
    let log = live.log_text();
    assert!(
        !log.contains("fenced: another processor") && !log.contains("engine failed"),
        "the live instance was fenced in turn:\n{}",
        live.log_tail()
    );
    let output = app.read(&app.output);
    assert_eq!(output.len(), 202, "warm, z, 100 during, 100 after");
    assert!(counts(&output).values().all(|&n| n == 1));
}

/// A purge of the repartition topic that failed while the broker was down is asked for again
/// once it is back, although the partitions have been idle since: what the dedup stage
/// committed is deleted from the repartition topic in the end.
#[tokio::test(flavor = "multi_thread")]
async fn a_purge_that_failed_while_the_broker_was_down_is_asked_for_again_on_idle_partitions() {
    let _serial = serial().await;
    let app = App::create(
        "purgeagain",
        AppOptions {
            partitions: 2,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            ..Default::default()
        },
    )
    .await;
    assert!(app.repartitions());
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids("purge", 0..200, t0));
    app.wait_until_processed(MINUTE);
    let repartition = app.repartition_topic();
    let committed = testbed::kafka::committed_offsets(&app.id, &repartition);
    assert!(
        committed.iter().all(|c| c.is_some_and(|o| o > 0)),
        "{committed:?}"
    );
    // Down for longer than a purge interval (30 s): the purge asked for meanwhile fails.
    testbed::kafka::stop_broker_for(Duration::from_secs(40));

    // Nothing is produced any more: only a purge asked for again can move the starts.
    let deadline = std::time::Instant::now() + 3 * MINUTE;
    loop {
        let starts = testbed::kafka::start_offsets(&repartition);
        if starts.iter().zip(&committed).all(|(s, c)| Some(*s) == *c) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the repartition topic was not purged up to the committed offsets {committed:?} after the broker came back: starts {starts:?}\n{}",
            p.log_tail()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(p.is_running(), "{}", p.log_tail());
}

/// A commit still unanswered when its retries end (the broker frozen for longer than the two
/// minutes the processor retries it) has an unknown outcome: the coordinator may still commit
/// it when the broker runs again, since the request waits in its socket. So the processor
/// starts its engine again and lets the coordinator decide, rather than taking the transaction
/// as aborted and processing its records again. Every id once.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_unanswered_past_its_retries_is_left_to_the_coordinator_and_every_id_is_output_once()
 {
    let _serial = serial().await;
    let app = App::with_partitions("lostcommit", 1).await;
    let t0 = now_ms();
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "pause-before-commit=1")]);
    p.wait_ready(MINUTE);
    app.produce(&ids("before", 0..50, t0));
    app.wait_until_processed(MINUTE);

    // x's transaction has its records delivered and its offsets sent; the broker freezes
    // before the commit is asked, for the 120 s of retries (calls of up to 10 s) and a margin.
    app.produce(&[Input::cmd("x", t0 + 100).header("streamapp.fault", "pause-before-commit:3000")]);
    wait_for_log(&p, "pausing before the commit", MINUTE);
    testbed::kafka::freeze_broker_for(Duration::from_secs(145));

    let mut more = ids("after", 0..50, t0 + 200);
    more.extend(ids("before", 0..10, t0 + 300)); // repeats
    more.push(Input::cmd("x", t0 + 400)); // a repeat
    app.produce(&more);
    app.wait_until_processed(3 * MINUTE);
    // The promise first: every id out exactly once, every repeat a duplicate.
    let output = counts(&app.read(&app.output));
    assert_eq!(output.len(), 101, "every id: {output:?}");
    assert!(
        output.values().all(|&n| n == 1),
        "every id once: {output:?}"
    );
    assert_eq!(
        app.read(&app.duplicates).len(),
        11,
        "the repeats are duplicates"
    );
    // And how: the commit was not aborted (it may have landed); the engine starts again and
    // the coordinator decides it. Before the fix the engine tried to abort it: librdkafka
    // refused while the commit was in flight, so the output was right, by luck of the client.
    assert!(p.is_running(), "{}", p.log_tail());
    assert!(
        p.log_text().contains("the commit's outcome is unknown"),
        "the commit was retried until its deadline and left to the coordinator:\n{}",
        p.log_tail()
    );
}

/// A changelog deleted and created again, which then grew past a store's offset, is still
/// another log: the store records the topic's id and is rebuilt from the new log instead of
/// replaying its tail from an offset that means something else there.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_of_a_recreated_changelog_that_grew_past_its_offset_is_rebuilt_not_mixed() {
    let _serial = serial().await;
    let app = App::with_partitions("regrown", 1).await;
    let t0 = now_ms();
    let mut a = app.start("pod-a");
    a.wait_ready(MINUTE);
    app.produce(&ids("old", 0..20, t0));
    app.wait_until_processed(MINUTE);
    a.drain_and_exit();

    // Recreated while pod-a is away (pod-b creates it again at start-up), then grown far
    // past pod-a's offset by pod-b.
    testbed::kafka::delete_topic(&app.changelog()).await;
    let mut b = app.start("pod-b");
    b.wait_ready(MINUTE);
    app.produce(&ids("new", 0..200, t0 + 1000));
    app.wait_until_processed(2 * MINUTE);
    b.drain_and_exit();

    // pod-a comes back to its old volume and gets the task.
    let mut a = app.start("pod-a");
    let health = a.wait_health("its task active", 2 * MINUTE, |h| {
        h.tasks.iter().any(|t| t.state == Some(TaskState::Active))
    });
    let task = &health.tasks[0];
    assert_eq!(task.opened, Some(StoreOpen::Rebuilt), "{task:?}");
    assert!(
        task.quarantines
            .iter()
            .any(|q| q.reason.contains("the changelog was recreated")),
        "{:?}",
        task.quarantines
    );
    // Every id the new changelog holds is remembered: their repeats are duplicates.
    app.produce(&ids("new", 0..200, t0 + 2000));
    app.wait_until_processed(2 * MINUTE);
    let output = counts(&app.read(&app.output));
    assert!(
        (0..200).all(|i| output[&format!("new-{i}")] == 1),
        "an id of the new changelog was output twice"
    );
    assert_eq!(app.read(&app.duplicates).len(), 200);
}

/// A store that takes longer to open than the transaction timeout (a slow disk, a big store)
/// is opened off the processing thread: the other partitions go on processing and committing
/// meanwhile, and no transaction is left open long enough for the coordinator to abort it (no
/// new producer, nothing processed twice).
#[tokio::test(flavor = "multi_thread")]
async fn a_store_slower_to_open_than_the_transaction_timeout_holds_back_no_other_partition() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use streamapp_api::health::ProcessorHealth;

    let _serial = serial().await;
    // Transactions time out after 10 s (the harness). The store of partition 1 takes 15 s to
    // open, after its first three opens failed on a held LOCK, so that it opens when the
    // back-off ends, while partition 0 processes. A commit every 3 s keeps a transaction open
    // nearly all the time while records come in.
    let app = App::create(
        "slowopen",
        AppOptions {
            partitions: 2,
            commit_interval: "3s",
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut p = app.start_with(
        "pod-0",
        &[("STREAMAPP_FAULTS", "locked-open-1=3,slow-open-1=15000")],
    );
    let state = |h: &ProcessorHealth, partition: i32| {
        h.tasks
            .iter()
            .find(|t| t.partition == partition)
            .and_then(|t| t.state)
    };
    p.wait_health(
        "partition 0 active while partition 1 backs off",
        MINUTE,
        |h| state(h, 0) == Some(TaskState::Active) && state(h, 1) == Some(TaskState::BackingOff),
    );

    // A steady stream of new ids into partition 0 until partition 1 is active.
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let (stop, input) = (stop.clone(), app.input.clone());
        std::thread::spawn(move || {
            let producer: BaseProducer = testbed::kafka::input_producer_config()
                .set("linger.ms", "5")
                .create()
                .unwrap();
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("s-{sent}");
                let value = format!(r#"{{"id":"{key}"}}"#);
                testbed::kafka::send(
                    &producer,
                    BaseRecord::to(&input)
                        .partition(0)
                        .key(&key)
                        .payload(&value),
                );
                producer.poll(Duration::ZERO);
                sent += 1;
                std::thread::sleep(Duration::from_millis(20)); // the stream's pace
            }
            producer.flush(Duration::from_secs(30)).unwrap();
            sent
        })
    };

    // While the store of partition 1 opens (15 s), partition 0's records keep being committed.
    wait_for_log(&p, "fault injection: opening the store slowly", MINUTE);
    let opening = std::time::Instant::now();
    let before = app.read(&app.output).len();
    let committed_while_opening = loop {
        let committed = app.read(&app.output).len() - before;
        if committed >= 20 && state(&p.live_health(), 1) != Some(TaskState::Active) {
            break Some(committed);
        }
        if opening.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    p.wait_health("partition 1 active", MINUTE, |h| {
        state(h, 1) == Some(TaskState::Active)
    });
    stop.store(true, Ordering::Relaxed);
    let sent = stream.join().unwrap();
    // Partition 1 works, and both stores remember what they saw.
    let mut more: Vec<Input> = (0..20)
        .map(|i| Input::cmd(&format!("one-{i}"), t0 + i).partition(1))
        .collect();
    more.extend((0..20).map(|i| Input::cmd(&format!("s-{i}"), t0 + 100).partition(0)));
    app.produce(&more);
    app.produce(&[Input::cmd("one-0", t0 + 200).partition(1)]);
    app.wait_until_processed(2 * MINUTE);
    assert!(p.is_running(), "{}", p.log_tail());

    let log = p.log_text();
    assert!(
        p.metric("streamapp_processor_transaction_timeouts_total") == Some(0.0)
            && !log.contains("outlived transaction.timeout.ms"),
        "the transaction open while the store of partition 1 opened outlived its timeout: the \
         coordinator aborted it and the producer was recreated:\n{}",
        p.log_tail()
    );
    assert_eq!(
        p.metric("streamapp_processor_transactions_aborted_total"),
        Some(0.0),
        "{}",
        p.log_tail()
    );
    assert!(
        committed_while_opening.is_some(),
        "partition 0 committed nothing in the 10 s after the store of partition 1 began to \
         open:\n{}",
        p.log_tail()
    );
    let output = app.read(&app.output);
    let distinct: HashSet<String> = output.iter().map(|o| o.id()).collect();
    assert_eq!(
        distinct.len(),
        sent + 20,
        "every id of the stream and one-0..20"
    );
    assert_eq!(output.len(), sent + 20, "each once");
    assert_eq!(
        app.read(&app.duplicates).len(),
        21,
        "the repeats on both partitions are duplicates"
    );
}
