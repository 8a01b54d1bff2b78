//! Several processing threads in one process (`processingThreads`, like Kafka Streams'
//! `num.stream.threads`), against the real broker: each thread is a group member of its own
//! with its own transactional producer, the threads split the partitions and all of them
//! process, the process reports every thread's tasks, drains them all, and exactly-once holds
//! through a kill -9 and a restart with another number of threads. With standbys, a pod's
//! threads keep their copies of the other pods' tasks, never of their own pod's.

use crate::common;

use std::time::Duration;

use common::*;
use streamapp_api::health::{ProcessorPhase, StoreOpen, TaskState};
use testbed::kafka;

use crate::standby::{in_state, one_standby_group, standbys_caught_up, took_over_without_a_replay};

const MINUTE: Duration = Duration::from_secs(60);

async fn two_thread_app(prefix: &str) -> App {
    App::create(
        prefix,
        AppOptions {
            partitions: 4,
            extra: serde_json::json!({ "processingThreads": 2 }),
            ..AppOptions::default()
        },
    )
    .await
}

fn ids(prefix: &str, range: std::ops::Range<usize>, t0: i64) -> Vec<Input> {
    range
        .map(|i| Input::cmd(&format!("{prefix}-{i}"), t0 + i as i64))
        .collect()
}

/// The output holds `ids` distinct ids, each once, and the duplicates topic `repeats` records.
fn assert_each_id_once(app: &App, ids: usize, repeats: usize) {
    let output = app.read(&app.output);
    let counted = counts(&output);
    let repeated: Vec<_> = counted.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        repeated.is_empty(),
        "ids output more than once: {repeated:?}"
    );
    assert_eq!(counted.len(), ids, "every id output");
    assert_eq!(app.read(&app.duplicates).len(), repeats);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_threads_split_the_partitions_each_a_member_with_its_own_producer_and_drain_together() {
    let _serial = serial().await;
    let app = two_thread_app("threads").await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);

    // Every id once, then each again: 4,000 outputs, 4,000 duplicates, over 4 partitions.
    app.produce(&ids("t", 0..4_000, t0));
    app.produce(&ids("t", 0..4_000, t0 + 10_000));
    app.wait_until_processed(MINUTE);
    assert_each_id_once(&app, 4_000, 4_000);

    // Two members of the group, two producers, both threads worked.
    assert_eq!(
        kafka::group_members(&app.id),
        2,
        "one group member per thread"
    );
    // Each thread has its own transactional id, and committed records with it: a thread
    // begins a transaction only for a record it processes. (Its CPU time is no proof: a
    // thread's share of 4,000 records can take less than the kernel's 10 ms tick.)
    for member in ["pod-0", "pod-0-thread-1"] {
        let txn = kafka::describe_transaction(&format!("{}-{member}", app.id));
        assert_eq!(
            txn.get("TransactionState").map(String::as_str),
            Some("CompleteCommit"),
            "thread {member} committed transactions of its own: {txn:?}"
        );
    }
    // The report lists both threads' tasks, each partition once.
    let health = p.live_health();
    let partitions: Vec<i32> = health.tasks.iter().map(|t| t.partition).collect();
    assert_eq!(partitions, vec![0, 1, 2, 3], "{health:?}");
    assert_eq!(p.metric("streamapp_processor_assigned_tasks"), Some(4.0));

    // One drain drains both threads: every store closed with a checkpoint.
    let out = p.drain();
    assert!(
        out.status.success(),
        "drain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(p.wait_exit(MINUTE), Some(0));
    assert_eq!(p.health().phase, ProcessorPhase::Drained);
    let report = inspect(&p.state);
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    assert!(
        tasks.iter().all(|t| t["checkpoint"].is_array()),
        "a checkpoint per task: {report}"
    );
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let health = p.health();
    assert_eq!(health.previous_shutdown_clean, Some(true));
    assert_eq!(health.tasks.len(), 4);
    for task in &health.tasks {
        assert_eq!(task.opened, Some(StoreOpen::Clean), "{task:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_thread_process_killed_mid_stream_and_restarted_with_one_thread_outputs_each_id_once()
{
    let _serial = serial().await;
    let mut app = two_thread_app("threads-kill").await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids("k", 0..3_000, t0));
    // Killed while it works through the second batch: open transactions on both threads.
    app.wait_for_records(&app.output, 1, MINUTE);
    app.produce(&ids("k", 3_000..20_000, t0));
    app.wait_for_records(&app.output, 4_000, MINUTE);
    p.kill9();

    // One thread now: the member `pod-0-thread-1` is gone for good; its partitions come to
    // `pod-0` once the group drops it (session timeout) and its open transaction ends (the
    // transaction timeout).
    app.rewrite_config(|c| c["processingThreads"] = serde_json::json!(1));
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids("k", 10_000..25_000, t0 + 1_000));
    app.wait_until_processed(Duration::from_secs(120));
    // The repeats of 10,000..20,000 are duplicates, nothing else.
    assert_each_id_once(&app, 25_000, 10_000);
    assert_eq!(kafka::group_members(&app.id), 1);
    assert_eq!(p.live_health().tasks.len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_two_thread_pod_takes_half_the_partitions_over_and_each_id_is_output_once() {
    let _serial = serial().await;
    let app = two_thread_app("threads-join").await;
    let t0 = now_ms();
    let mut p0 = app.start("pod-0");
    p0.wait_ready(MINUTE);
    app.produce(&ids("j", 0..4_000, t0));
    app.wait_until_processed(MINUTE);

    // Four members now, one partition each: pod-0 keeps two, and where a partition moves
    // between its threads the store passes from one thread to the other inside the process.
    let mut p1 = app.start("pod-1");
    p1.wait_ready(MINUTE);
    p0.wait_health("two tasks left on pod-0", MINUTE, |h| h.tasks.len() == 2);
    p1.wait_health("two tasks on pod-1", MINUTE, |h| h.tasks.len() == 2);
    assert_eq!(kafka::group_members(&app.id), 4);
    app.produce(&ids("j", 2_000..6_000, t0 + 5_000));
    app.wait_until_processed(MINUTE);
    assert_each_id_once(&app, 6_000, 2_000);
    // A store passing between two threads of a process is opened once the other closed it,
    // never found locked by it.
    for p in [&p0, &p1] {
        let log = p.log_text();
        assert!(
            !log.contains("store unavailable"),
            "{}: a store backed off:\n{log}",
            p.pod
        );
    }
}

/// Two pods of two threads, a standby each: four members, each task active on one thread and
/// kept warm on the other pod, never on its own (a pod has one store directory per task).
/// When a pod is lost, the other pod's threads take its tasks from their copies, replaying
/// nothing, and each id is output once.
#[tokio::test(flavor = "multi_thread")]
async fn two_thread_pods_with_standbys_keep_the_copies_on_the_other_pod_and_fail_over_without_a_replay()
 {
    let _serial = serial().await;
    let app = App::create(
        "threads-standby",
        AppOptions {
            partitions: 4,
            extra: serde_json::json!({
                "processingThreads": 2,
                "group": one_standby_group(),
            }),
            ..AppOptions::default()
        },
    )
    .await;
    const IDS: usize = 40_000;
    let t0 = now_ms();
    let mut a = app.start("pod-a");
    let mut b = app.start("pod-b");
    a.wait_ready(MINUTE);
    b.wait_ready(MINUTE);
    app.produce(&ids("s", 0..IDS, t0));
    app.wait_until_processed(2 * MINUTE);
    assert_eq!(kafka::group_members(&app.id), 4, "two pods of two threads");

    let ends = kafka::end_offsets(&app.changelog());
    let settled = |h: &streamapp_api::health::ProcessorHealth| {
        in_state(h, TaskState::Active).len() == 2
            && in_state(h, TaskState::Standby).len() == 2
            && standbys_caught_up(h, &ends)
    };
    let a_health = a.wait_health(
        "two active tasks, two caught-up standbys",
        2 * MINUTE,
        settled,
    );
    let b_health = b.wait_health(
        "two active tasks, two caught-up standbys",
        2 * MINUTE,
        settled,
    );
    let a_active = in_state(&a_health, TaskState::Active);
    assert_eq!(
        in_state(&b_health, TaskState::Standby),
        a_active,
        "pod-b keeps pod-a's tasks warm"
    );
    assert_eq!(
        in_state(&a_health, TaskState::Standby),
        in_state(&b_health, TaskState::Active),
        "pod-a keeps pod-b's tasks warm"
    );

    // pod-a is lost: pod-b's two threads take its tasks over from their standbys.
    a.kill9();
    let taken_over = b.wait_health("every task active on pod-b", 2 * MINUTE, |h| {
        in_state(h, TaskState::Active).len() == 4
    });
    took_over_without_a_replay(&b, &taken_over, &a_active);
    assert_eq!(
        kafka::group_members(&app.id),
        2,
        "pod-a's members left with it"
    );

    // Exactly once across the failover: new ids once, repeats of old ones are duplicates.
    app.produce(&ids("s", IDS - 1_000..IDS + 1_000, t0 + 20_000));
    app.wait_until_processed(2 * MINUTE);
    assert_each_id_once(&app, IDS + 1_000, 1_000);
}
