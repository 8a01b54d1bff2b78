//! Standby replicas against the real broker (invariant 6 of docs/design.md).
//!
//! First the state updater on its own: it keeps a store warm by following its changelog with read_committed, and the store
//! never holds a record of an aborted transaction, nor one of a transaction still open; its
//! changelog offset is written in the same batch as the records, so it never vouches for more
//! than the store holds. Promoting the standby is the ordinary restore, with nothing left to
//! replay.
//!
//! A changelog here is written by a transactional producer standing in for the active task
//! (keys are ids, values 8-byte big-endian times, as the engine writes them). Writes to a store
//! only ever add ids (the window is far longer than the test), so an aborted id absent from the
//! store at the end was never in it.
//!
//! Then running processors with `group.standbyReplicas: 1` (the processor's own state-aware
//! membership): a lost pod's tasks go to the holders of their standbys, a new pod warms up
//! before a task moves to it, and the incident this product was built after, replayed with
//! standbys.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{App, AppOptions, Input, Processor, counts, inspect, now_ms, serial};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamapp_api::config::{ResolvedRocksDb, RocksDbProfile};
use streamapp_api::health::{ProcessorHealth, TaskState};
use streamapp_processor::faults::RestoreFault;
use streamapp_processor::state_updater::{StateUpdater, Update};
use streamapp_processor::store::{ChangelogIdentity, MemoryRole, SharedMemory, TaskStore, Window};
use testbed::kafka;

const PARTITIONS: i32 = 2;
const TXN_TIMEOUT: Duration = Duration::from_secs(30);

fn open_store(dir: &Path, topic: &str, partition: i32) -> TaskStore {
    let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
    TaskStore::open(
        dir,
        None,
        &tuning,
        &SharedMemory::new(&tuning, true),
        MemoryRole::Standby,
        Window {
            retention: Duration::from_secs(24 * 3600),
            max_skew: Duration::from_secs(24 * 3600),
        },
        &ChangelogIdentity {
            topic: topic.to_string(),
            partition,
            topic_id: None,
        },
    )
    .expect("opening a store")
}

/// Writes `ids` to the changelog partition inside the producer's open transaction.
fn write(producer: &BaseProducer, topic: &str, partition: i32, ids: &[String]) {
    let time = now_ms().to_be_bytes();
    for id in ids {
        kafka::send(
            producer,
            BaseRecord::to(topic)
                .partition(partition)
                .key(id.as_bytes())
                .payload(&time[..]),
        );
    }
    producer
        .flush(TXN_TIMEOUT)
        .expect("flushing the transaction's records");
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Follows the updater's reports until the partition's store has applied the changelog up to
/// `offset`, or `timeout`. Returns the store's offsets as reported, in order.
fn wait_for_offset(
    updater: &mut StateUpdater,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> Vec<i64> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match updater.next_update() {
            Some(Update::Progress {
                partition: p,
                changelog_offset: Some(o),
                ..
            }) if p == partition => {
                seen.push(o);
                if o >= offset {
                    return seen;
                }
            }
            Some(Update::Failed { error, .. }) => panic!("the standby failed: {error}"),
            Some(Update::ReaderFailed { error, .. }) => panic!("the follower failed: {error}"),
            Some(Update::Restored { partition: p, .. }) if p == partition => {
                panic!("a standby is never reported restored: it follows until taken back")
            }
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    panic!(
        "partition {partition}'s standby did not reach changelog offset {offset} within {timeout:?}; reported {seen:?}"
    );
}

fn held(store: &TaskStore, ids: &[String]) -> usize {
    ids.iter()
        .filter(|id| store.first_seen(id.as_bytes()).unwrap().is_some())
        .count()
}

/// A new compacted changelog topic, a directory for the stores, and the transactional producer
/// that stands in for the active task.
fn changelog() -> (String, tempfile::TempDir, BaseProducer) {
    let topic = testbed::unique_name("standby-changelog");
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic_with(
            &topic,
            PARTITIONS,
            &[("cleanup.policy", "compact")],
        ));
    let active = kafka::transactional_producer(&format!("{topic}-active"));
    (topic, tempfile::tempdir().unwrap(), active)
}

#[test]
fn a_standby_holds_only_committed_records_and_promotes_without_a_replay() {
    let (topic, dir, active) = changelog();
    let p = 1;

    // Before the standby starts: one committed and one aborted transaction.
    let committed_before = ids("committed-before", 200);
    let aborted_before = ids("aborted-before", 200);
    active.begin_transaction().unwrap();
    write(&active, &topic, p, &committed_before);
    active.commit_transaction(TXN_TIMEOUT).unwrap();
    active.begin_transaction().unwrap();
    write(&active, &topic, p, &aborted_before);
    active.abort_transaction(TXN_TIMEOUT).unwrap();

    let mut updater = StateUpdater::start(&kafka::client_config(), &topic).unwrap();
    updater.follow(p, open_store(&dir.path().join("standby"), &topic, p));
    let end = kafka::end_offsets(&topic)[p as usize];
    wait_for_offset(&mut updater, p, end, Duration::from_secs(30));

    // A transaction left open: the standby applies nothing of it and its offset stays at the
    // transaction's first record (the last stable offset), however long it waits.
    let open_start = kafka::end_offsets(&topic)[p as usize];
    let in_open = ids("in-open", 300);
    active.begin_transaction().unwrap();
    write(&active, &topic, p, &in_open);
    std::thread::sleep(Duration::from_secs(2));
    let mut while_open = Vec::new();
    while let Some(update) = updater.next_update() {
        if let Update::Progress {
            partition,
            changelog_offset: Some(o),
            ..
        } = update
            && partition == p
        {
            while_open.push(o);
        }
    }
    assert!(
        while_open.iter().all(|&o| o <= open_start),
        "the standby's offset passed the open transaction's start {open_start}: {while_open:?}"
    );
    active.commit_transaction(TXN_TIMEOUT).unwrap();

    // Then more aborted and committed transactions while it follows.
    let aborted_after = ids("aborted-after", 300);
    active.begin_transaction().unwrap();
    write(&active, &topic, p, &aborted_after);
    active.abort_transaction(TXN_TIMEOUT).unwrap();
    let committed_after = ids("committed-after", 300);
    active.begin_transaction().unwrap();
    write(&active, &topic, p, &committed_after);
    active.commit_transaction(TXN_TIMEOUT).unwrap();
    let end = kafka::end_offsets(&topic)[p as usize];
    wait_for_offset(&mut updater, p, end, Duration::from_secs(30));

    let store = updater.take(p).expect("the standby's store comes back");
    assert_eq!(
        store.meta().changelog_offset,
        Some(end),
        "past the last commit marker"
    );
    assert_eq!(held(&store, &committed_before), committed_before.len());
    assert_eq!(held(&store, &in_open), in_open.len());
    assert_eq!(held(&store, &committed_after), committed_after.len());
    assert_eq!(
        held(&store, &aborted_before),
        0,
        "an aborted id reached the standby"
    );
    assert_eq!(
        held(&store, &aborted_after),
        0,
        "an aborted id reached the standby"
    );
    assert_eq!(store.id_count().unwrap(), 800, "exactly the committed ids");

    // Promotion: the ordinary restore, which finds nothing left to replay.
    updater.restore(p, store, RestoreFault::default());
    let deadline = Instant::now() + Duration::from_secs(30);
    let restored = loop {
        assert!(
            Instant::now() < deadline,
            "the promoted standby was not restored"
        );
        match updater.next_update() {
            Some(Update::Restored {
                partition,
                restored,
                store,
            }) if partition == p => break (restored, store),
            Some(Update::Failed { error, .. }) => panic!("restoring the standby failed: {error}"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert_eq!(restored.0, 0, "a caught-up standby replays nothing");
    assert_eq!(restored.1.meta().changelog_offset, Some(end));
}

#[test]
fn standbys_of_several_partitions_follow_at_once_and_survive_a_reopen() {
    let (topic, dir, active) = changelog();
    let mut updater = StateUpdater::start(&kafka::client_config(), &topic).unwrap();
    for p in 0..PARTITIONS {
        updater.follow(p, open_store(&dir.path().join(p.to_string()), &topic, p));
    }
    let mut written: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for round in 0..5 {
        active.begin_transaction().unwrap();
        for p in 0..PARTITIONS {
            let batch = ids(&format!("p{p}-r{round}"), 100);
            write(&active, &topic, p, &batch);
            written.entry(p).or_default().extend(batch);
        }
        active.commit_transaction(TXN_TIMEOUT).unwrap();
    }
    let ends = kafka::end_offsets(&topic);
    for p in 0..PARTITIONS {
        wait_for_offset(&mut updater, p, ends[p as usize], Duration::from_secs(30));
    }
    for p in 0..PARTITIONS {
        let store = updater.take(p).expect("the standby's store comes back");
        assert_eq!(held(&store, &written[&p]), 500, "partition {p}");
        store.close().unwrap();
        // What a restarted pod finds on its volume: the offset was written with the records.
        let reopened = open_store(&dir.path().join(p.to_string()), &topic, p);
        assert_eq!(reopened.meta().changelog_offset, Some(ends[p as usize]));
        assert_eq!(reopened.id_count().unwrap(), 500, "partition {p}");
    }
    assert!(updater.take(0).is_none(), "taken back already");
}

// ---- standbys in running processors --------------------------------------------------------

const MINUTE: Duration = Duration::from_secs(60);

/// The group settings of an app with one standby copy of each task, whose warm-ups move
/// within the test's time (a probing rebalance every 5 s).
pub(crate) fn one_standby_group() -> serde_json::Value {
    serde_json::json!({ "standbyReplicas": 1, "probingRebalanceInterval": "5s" })
}

/// An app whose processors keep one standby copy of each task and run StreamApp's own,
/// state-aware group membership.
async fn app_with_standbys(prefix: &str, partitions: i32) -> App {
    App::create(
        prefix,
        AppOptions {
            partitions,
            extra: serde_json::json!({ "group": one_standby_group() }),
            ..Default::default()
        },
    )
    .await
}

/// The partitions the health report lists in `state`.
pub(crate) fn in_state(h: &ProcessorHealth, state: TaskState) -> BTreeSet<i32> {
    h.tasks
        .iter()
        .filter(|t| t.state == Some(state))
        .map(|t| t.partition)
        .collect()
}

/// Every standby copy the report lists has applied its changelog up to `ends`.
pub(crate) fn standbys_caught_up(h: &ProcessorHealth, ends: &[i64]) -> bool {
    let standbys: Vec<_> = h
        .tasks
        .iter()
        .filter(|t| t.state == Some(TaskState::Standby))
        .collect();
    !standbys.is_empty()
        && standbys
            .iter()
            .all(|t| t.store_changelog_offset == Some(ends[t.partition as usize]))
}

/// Asserts that pod-b (`pod`, its report `taken_over`) took the `promoted` tasks over from
/// caught-up standbys: each reports an empty replay, and the pod restored nothing at all.
/// Returns the promoted partitions.
pub(crate) fn took_over_without_a_replay(
    pod: &Processor,
    taken_over: &ProcessorHealth,
    promoted: &BTreeSet<i32>,
) -> Vec<i32> {
    let tasks: Vec<_> = taken_over
        .tasks
        .iter()
        .filter(|t| promoted.contains(&t.partition))
        .collect();
    for t in &tasks {
        let restore = t
            .restore
            .as_ref()
            .expect("a promoted standby reports its replay");
        assert_eq!(
            (restore.records_to_restore, restore.records_restored),
            (0, 0),
            "partition {} was caught up on pod-b: nothing to replay",
            t.partition
        );
    }
    assert_eq!(
        pod.metric("streamapp_processor_restore_records_total"),
        Some(0.0),
        "pod-b restored nothing at all"
    );
    tasks.iter().map(|t| t.partition).collect()
}

/// Asserts that each pod runs some tasks and keeps a standby of each of the other's; returns
/// the active tasks of each.
fn each_active_here_and_warm_there(
    a: &ProcessorHealth,
    b: &ProcessorHealth,
) -> (BTreeSet<i32>, BTreeSet<i32>) {
    let a_active = in_state(a, TaskState::Active);
    let b_active = in_state(b, TaskState::Active);
    assert!(
        !a_active.is_empty() && !b_active.is_empty(),
        "{a_active:?} {b_active:?}"
    );
    assert_eq!(a_active, in_state(b, TaskState::Standby));
    assert_eq!(b_active, in_state(a, TaskState::Standby));
    (a_active, b_active)
}

/// Starts pod-a and pod-b and has them process `ids` distinct ids.
fn two_pods_with(app: &App, ids: usize) -> [Processor; 2] {
    let mut pods = [app.start("pod-a"), app.start("pod-b")];
    for p in &mut pods {
        p.wait_ready(MINUTE);
    }
    let t0 = now_ms();
    let inputs: Vec<Input> = (0..ids)
        .map(|i| Input::cmd(&format!("id-{i}"), t0 + (i as i64 % 1000)))
        .collect();
    app.produce(&inputs);
    app.wait_until_processed(3 * MINUTE);
    pods
}

/// [`two_pods_with`], then waits until each keeps caught-up standbys of the other's tasks;
/// returns them with their health reports then.
fn two_pods_holding(app: &App, ids: usize) -> [(Processor, ProcessorHealth); 2] {
    let pods = two_pods_with(app, ids);
    let ends = kafka::end_offsets(&app.changelog());
    pods.map(|mut p| {
        let health = p.wait_health("caught-up standbys", 2 * MINUTE, |h| {
            standbys_caught_up(h, &ends)
        });
        (p, health)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_pods_tasks_go_to_the_holders_of_their_standbys_which_replay_only_the_tail() {
    let _serial = serial().await;
    const PARTITIONS: i32 = 4;
    const IDS: usize = 500_000;
    let app = app_with_standbys("failover", PARTITIONS).await;
    let [(mut a, a_health), (mut b, b_health)] = two_pods_holding(&app, IDS);
    let ends = kafka::end_offsets(&app.changelog());

    // Each task is active on one pod and kept warm on the other.
    let (a_active, b_active) = each_active_here_and_warm_there(&a_health, &b_health);
    assert_eq!(
        a_active.len() + b_active.len(),
        PARTITIONS as usize,
        "each task active once"
    );
    for p in &a_active {
        let series = format!("streamapp_processor_standby_lag{{partition=\"{p}\"}}");
        assert_eq!(b.metric(&series), Some(0.0), "{series}");
    }
    // pod-b's standby copies have memtables of their own budget, apart from its active ones.
    const STANDBY_MEMTABLES: &str = "streamapp_processor_memtable_bytes{role=\"standby\"}";
    const ACTIVE_MEMTABLES: &str = "streamapp_processor_memtable_bytes{role=\"active\"}";
    assert!(
        b.metric(STANDBY_MEMTABLES).unwrap() > 0.0,
        "{STANDBY_MEMTABLES}"
    );

    // pod-a is lost for good: after its session times out, pod-b, which holds the standbys of
    // pod-a's tasks, takes them over and replays nothing (its copies are caught up), while a
    // pod without them would have restored the ~IDS/2 records of their changelogs.
    a.kill9();
    let taken_over = b.wait_health("every task active", 2 * MINUTE, |h| {
        in_state(h, TaskState::Active).len() == PARTITIONS as usize
    });
    for p in took_over_without_a_replay(&b, &taken_over, &a_active) {
        assert!(ends[p as usize] > 50_000, "a store worth keeping warm");
    }

    // Exactly once across the failover: new ids once, repeats of old ones are duplicates.
    let t1 = now_ms();
    let more: Vec<Input> = (0..1000)
        .map(|i| Input::cmd(&format!("new-{i}"), t1))
        .chain((0..1000).map(|i| Input::cmd(&format!("id-{i}"), t1)))
        .collect();
    app.produce(&more);
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), IDS + 1000, "each id once");
    let counted = counts(&output);
    assert!(counted.values().all(|&n| n == 1), "an id was output twice");
    assert_eq!(app.read(&app.duplicates).len(), 1000);
    // The promoted copies were reopened for the active budget: pod-b keeps no standby now,
    // and nothing counts against the standby budget any more.
    assert_eq!(
        b.metric(STANDBY_MEMTABLES),
        Some(0.0),
        "{STANDBY_MEMTABLES}"
    );
    assert!(
        b.metric(ACTIVE_MEMTABLES).unwrap() > 0.0,
        "{ACTIVE_MEMTABLES}"
    );

    // The stores hold every id once.
    b.drain();
    b.wait_exit(MINUTE);
    let report = inspect(&b.state);
    let ids: u64 = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ids"].as_u64().unwrap())
        .sum();
    assert_eq!(ids, (IDS + 1000) as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_back_after_an_unclean_stop_reports_the_stores_on_its_volume_and_gets_tasks_back_at_once()
 {
    let _serial = serial().await;
    const PARTITIONS: i32 = 4;
    let app = app_with_standbys("unclean", PARTITIONS).await;
    let [(mut a, _), (b, _)] = two_pods_holding(&app, 20_000);

    // pod-a dies (no checkpoints written) and stays away past its session: pod-b takes every
    // task over. Nothing is produced since, so pod-a's stores stay caught up.
    a.kill9();
    let mut b = b;
    b.wait_health("every task active", 2 * MINUTE, |h| {
        in_state(h, TaskState::Active).len() == PARTITIONS as usize
    });
    let ends = kafka::end_offsets(&app.changelog());
    assert!(
        a.state.join("tasks").read_dir().unwrap().count() == PARTITIONS as usize,
        "pod-a left a store of every task (active or standby) on its volume"
    );

    // Back, it reports what those stores hold (read read-only, before it opens any), so the
    // leader sees them caught up and hands tasks back as active at once, not as warm-ups.
    let before = a.log_text().len();
    let mut a = app.start("pod-a");
    let back = a.wait_health("tasks back", 2 * MINUTE, |h| {
        !in_state(h, TaskState::Active).is_empty()
    });
    let log = a.log_text()[before..].to_string();
    let reported = log
        .lines()
        .filter(|l| l.contains("a store left by an unclean stop: reporting the offset it holds"))
        .count();
    assert_eq!(reported, PARTITIONS as usize, "{log}");
    let first_share = log
        .lines()
        .find(|l| l.contains("tasks assigned"))
        .expect("an assignment");
    assert!(
        !first_share.contains("active=[]") && !first_share.contains(": true"),
        "the first share has active tasks and no warm-up: {first_share}"
    );
    for t in back
        .tasks
        .iter()
        .filter(|t| t.state == Some(TaskState::Active))
    {
        let restore = t
            .restore
            .as_ref()
            .expect("an activated task reports its replay");
        assert_eq!(
            restore.records_to_restore, 0,
            "partition {} was caught up on pod-a's volume (end {})",
            t.partition, ends[t.partition as usize]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn standbys_work_over_tls_and_sasl_scram_like_the_rest_of_the_processor() {
    let _serial = serial().await;
    const PARTITIONS: i32 = 4;
    const IDS: usize = 5_000;
    let mut app = app_with_standbys("secure", PARTITIONS).await;
    // Every connection of the processor, its own group membership's too, goes to the
    // SASL_SSL listener with SCRAM-SHA-512 and the test bed's CA.
    let listener = kafka::secure_listener();
    app.rewrite_config(|c| {
        c["kafka"]["bootstrapServers"] = listener.bootstrap.clone().into();
        for (k, v) in listener.properties("SCRAM-SHA-512") {
            c["kafka"]["properties"][k] = v.into();
        }
    });
    let [(a, a_health), (b, b_health)] = two_pods_holding(&app, IDS);
    each_active_here_and_warm_there(&a_health, &b_health);
    for pod in [&a, &b] {
        assert!(
            !pod.log_text()
                .contains("group coordinator connection refused"),
            "{}",
            pod.log_tail()
        );
    }
    let output = app.read(&app.output);
    assert_eq!(output.len(), IDS, "each id once");
    assert!(
        counts(&output).values().all(|&n| n == 1),
        "an id was output twice"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_pods_open_transaction_is_ended_by_the_next_leader_not_left_to_its_timeout() {
    let _serial = serial().await;
    // A transaction timeout far longer than this test waits: only the fence can end pod-a's
    // open transaction in time, and until it ends no read_committed reader gets past it.
    let app = App::create(
        "fence",
        AppOptions {
            partitions: 4,
            kafka_properties: serde_json::json!({
                "transaction.timeout.ms": "300000",
                "session.timeout.ms": "6000",
            }),
            extra: serde_json::json!({ "group": one_standby_group() }),
            ..Default::default()
        },
    )
    .await;
    let [mut a, mut b] = two_pods_with(&app, 20_000);
    // pod-a must hold active tasks to be frozen inside a transaction. Whether the first
    // assignment gives it any depends on how far pod-b's stores had got when pod-a joined
    // (caught-up stores keep their tasks; pod-a then warms up first): the probing rebalance
    // moves its share once its copies are caught up.
    a.wait_health("pod-a active for some tasks", MINUTE, |h| {
        !in_state(h, TaskState::Active).is_empty()
    });
    let a_transactional_id = format!("{}-pod-a", app.id);

    // Records keep coming while pod-a is frozen in the middle of a transaction (stopped, and
    // started again until the coordinator shows one of its transactions open), then killed:
    // its transaction stays open behind it.
    let frozen = AtomicBool::new(false);
    let more = std::thread::scope(|scope| {
        let producer = scope.spawn(|| {
            let mut sent = 0;
            while !frozen.load(Ordering::SeqCst) && sent < 400_000 {
                let t = now_ms();
                let batch: Vec<Input> = (sent..sent + 2_000)
                    .map(|i| Input::cmd(&format!("more-{i}"), t))
                    .collect();
                app.produce(&batch);
                sent += 2_000;
                std::thread::sleep(Duration::from_millis(50));
            }
            sent
        });
        let mut open = false;
        for _ in 0..50 {
            a.signal("STOP");
            let state = kafka::describe_transaction(&a_transactional_id)
                .remove("TransactionState")
                .unwrap_or_default();
            if state == "Ongoing" {
                open = true;
                break;
            }
            a.signal("CONT");
            std::thread::sleep(Duration::from_millis(30));
        }
        frozen.store(true, Ordering::SeqCst);
        assert!(open, "pod-a never stopped inside a transaction");
        producer.join().unwrap()
    });
    a.kill9();

    // pod-b leads once pod-a's session ends and fences pod-a's transactional id: everything
    // is processed long before the 5-minute timeout would have ended that transaction.
    app.wait_until_processed(2 * MINUTE);
    assert!(
        b.log_text()
            .contains("fenced a departed member's transactional id")
            && b.log_text().contains("pod-a"),
        "pod-b did not fence pod-a:\n{}",
        b.log_tail()
    );
    let output = app.read(&app.output);
    assert_eq!(output.len(), 20_000 + more, "each id once");
    assert!(
        counts(&output).values().all(|&n| n == 1),
        "an id was output twice"
    );
    b.drain();
    b.wait_exit(MINUTE);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_standbys_the_same_failover_restores_the_lost_pods_whole_changelogs() {
    // The run the test above is measured against: the same pods, ids and kill, no standbys.
    let _serial = serial().await;
    const PARTITIONS: i32 = 4;
    const IDS: usize = 500_000;
    let app = App::with_partitions("no-standbys", PARTITIONS).await;
    let [mut a, mut b] = two_pods_with(&app, IDS);
    let a_active = in_state(&a.live_health(), TaskState::Active);
    assert!(!a_active.is_empty(), "pod-a had tasks");
    assert!(in_state(&b.live_health(), TaskState::Standby).is_empty());

    a.kill9();
    let taken_over = b.wait_health("every task active", 2 * MINUTE, |h| {
        in_state(h, TaskState::Active).len() == PARTITIONS as usize
    });
    let restored: u64 = taken_over
        .tasks
        .iter()
        .filter(|t| a_active.contains(&t.partition))
        .map(|t| {
            t.restore
                .as_ref()
                .expect("a restored task reports it")
                .records_restored
        })
        .sum();
    assert!(
        restored >= (IDS / PARTITIONS as usize * a_active.len()) as u64 * 9 / 10,
        "pod-b rebuilt pod-a's stores from their whole changelogs: {restored} records for {a_active:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_pod_warms_a_copy_up_before_a_task_moves_to_it_and_replays_at_most_a_short_tail() {
    let _serial = serial().await;
    const PARTITIONS: i32 = 4;
    const IDS: usize = 200_000;
    const ACCEPTABLE_LAG: u64 = 2_000;
    let app = App::create(
        "scale-out",
        AppOptions {
            partitions: PARTITIONS,
            extra: serde_json::json!({
                "group": {
                    "standbyReplicas": 1,
                    "probingRebalanceInterval": "5s",
                    "acceptableRecoveryLag": ACCEPTABLE_LAG,
                },
            }),
            ..Default::default()
        },
    )
    .await;
    let _pods = two_pods_holding(&app, IDS);

    // pod-c joins with nothing on its volume: its share of the tasks stays active where the
    // state is while pod-c warms a copy up, and processing goes on meanwhile.
    let mut c = app.start("pod-c");
    let warming = c.wait_health("a warm-up", MINUTE, |h| {
        !in_state(h, TaskState::WarmingUp).is_empty()
    });
    let moving = in_state(&warming, TaskState::WarmingUp);
    assert!(
        in_state(&warming, TaskState::Active).is_empty(),
        "no task moved to pod-c before its copy was warm: {warming:?}"
    );
    let t1 = now_ms();
    let during: Vec<Input> = (0..5_000)
        .map(|i| Input::cmd(&format!("during-{i}"), t1))
        .collect();
    app.produce(&during);

    // A probing rebalance moves them once the copies are within the acceptable lag.
    let moved = c.wait_health("the warmed-up tasks active", 2 * MINUTE, |h| {
        moving.is_subset(&in_state(h, TaskState::Active))
    });
    for t in moved.tasks.iter().filter(|t| moving.contains(&t.partition)) {
        let restore = t
            .restore
            .as_ref()
            .expect("the promotion reports its replay");
        assert!(
            restore.records_restored <= ACCEPTABLE_LAG,
            "partition {} replayed {} records, more than the acceptable lag",
            t.partition,
            restore.records_restored
        );
    }
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), IDS + 5_000, "each id once");
    assert!(
        counts(&output).values().all(|&n| n == 1),
        "an id was output twice"
    );
    assert!(app.read(&app.duplicates).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_incident_with_standbys_an_aborted_put_reaches_neither_store_and_the_id_is_output_once()
{
    // The incident behind this product happened with standbys: A (active) puts an id and
    // fails, the task moves to B, which held a standby, B puts it and fails too, and the task
    // returns to A. Neither store may ever hold the aborted put.
    let _serial = serial().await;
    let app = app_with_standbys("incident", 1).await;
    let t0 = now_ms();
    let crash = [("STREAMAPP_FAULTS", "crash-after-put=1")];
    let mut a = app.start_with("pod-a", &crash);
    a.wait_ready(MINUTE);
    app.produce(&[Input::cmd("warmup", t0)]);
    app.wait_for_records(&app.output, 1, MINUTE);
    app.wait_until_processed(MINUTE);
    let mut b = app.start_with("pod-b", &crash);
    let ends = kafka::end_offsets(&app.changelog());
    b.wait_health("a caught-up standby of partition 0", MINUTE, |h| {
        standbys_caught_up(h, &ends)
    });

    // A stages the put of cmd-x and dies before the commit (abort(): kill -9 semantics).
    app.produce(&[Input::cmd("cmd-x", t0 + 1).header("streamapp.fault", "crash-after-put")]);
    assert_ne!(a.wait_exit(MINUTE), Some(0), "A crashed after the put");
    // B's standby is promoted once A's session times out; it stages the put and dies too.
    assert_ne!(
        b.wait_exit(2 * MINUTE),
        Some(0),
        "B crashed after the put:\n{}",
        b.log_tail()
    );
    assert!(
        b.log_text().contains("standby follows the changelog"),
        "B held a standby before it took the task over:\n{}",
        b.log_tail()
    );

    // Neither store holds cmd-x: only the warm-up id, which both committed or followed.
    for (pod, state) in [("A", &a.state), ("B", &b.state)] {
        let report = inspect(state);
        assert_eq!(report["tasks"][0]["ids"], 1, "{pod}'s store: {report}");
    }

    // Both come back without faults: cmd-x is processed once, and the pod that does not
    // process it keeps a standby copy that catches up with it.
    let mut a = app.start("pod-a");
    a.wait_ready(2 * MINUTE);
    let mut b = app.start("pod-b");
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    assert_eq!(counts(&output).get("cmd-x"), Some(&1), "{output:?}");
    assert_eq!(output.len(), 2);
    assert!(
        app.read(&app.duplicates).is_empty(),
        "cmd-x was never a duplicate"
    );
    let ends = kafka::end_offsets(&app.changelog());
    wait_for_a_caught_up_standby(&mut [&mut a, &mut b], &ends, MINUTE);
    a.drain();
    b.drain();
    a.wait_exit(MINUTE);
    b.wait_exit(MINUTE);
    for (pod, state) in [("A", &a.state), ("B", &b.state)] {
        let report = inspect(state);
        assert_eq!(report["tasks"][0]["ids"], 2, "{pod}'s store: {report}");
    }
}

/// Waits until one of `pods` keeps a standby copy caught up with `ends` (which pod holds the
/// active task after both restarted uncleanly is the assignor's choice).
fn wait_for_a_caught_up_standby(pods: &mut [&mut Processor], ends: &[i64], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !pods
        .iter()
        .any(|p| standbys_caught_up(&p.live_health(), ends))
    {
        assert!(
            Instant::now() < deadline,
            "no caught-up standby within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
