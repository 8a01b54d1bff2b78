//! The world around the processor misbehaving: a full state volume, a changelog recreated
//! behind its back or with a stale retention, a transaction outliving its timeout, a zombie on
//! another pod, a broker crash. The processor must recover by itself, without quarantining
//! healthy stores, exiting as fenced, or losing and doubling anything.

mod common;

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
    let app = App::create(
        "diskfull",
        AppOptions {
            partitions: 1,
            ..Default::default()
        },
    )
    .await;
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
    let app = App::create(
        "recreated",
        AppOptions {
            partitions: 1,
            ..Default::default()
        },
    )
    .await;
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
        task.quarantines[0]
            .reason
            .contains("recreated or lost data"),
        "{}",
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
    let app = App::create(
        "txntimeout",
        AppOptions {
            partitions: 1,
            ..Default::default()
        },
    )
    .await;
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
    let app = App::create(
        "zombie",
        AppOptions {
            partitions: 2,
            ..Default::default()
        },
    )
    .await;
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
    let app = App::create(
        "brokercrash",
        AppOptions {
            partitions: 2,
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
    // Mid-traffic: the processors are working on those 500.
    testbed::kafka::kill_and_restart_broker();
    let mut second = ids("k", 500..800, t0);
    second.extend(ids("k", 0..200, t0 + 1000)); // repeats
    app.produce(&second);
    app.wait_until_processed(3 * MINUTE);
    assert!(a.is_running(), "{}", a.log_tail());
    assert!(b.is_running(), "{}", b.log_tail());
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
    let mut app = App::create(
        "txntimeout",
        AppOptions {
            partitions: 1,
            ..Default::default()
        },
    )
    .await;
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
    let app = App::create(
        "restorewait",
        AppOptions {
            partitions: 2,
            ..Default::default()
        },
    )
    .await;
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
    // timeout for it: a minute).
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

    foreign.abort_transaction(Duration::from_secs(10)).unwrap();
    b.wait_ready(MINUTE);
    assert!(
        b.log_text()
            .contains("open transaction on the changelog ended")
    );
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
