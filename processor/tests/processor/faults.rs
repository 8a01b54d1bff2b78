//! Fault injection: failures after a store put, task migration with old state dirs, revokes,
//! kill -9 in a loop, at a suspended store and between the Kafka commit and the store apply, a
//! panic in the state updater, and damaged RocksDB files. Exactly-once must hold through all
//! of it.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{App, AppOptions, Input, counts, inspect, now_ms, serial, wait_for_log};
use rand::RngExt;
use streamapp_api::health::{StoreOpen, TaskState, VerificationReason};
use testbed::store_damage::{self, Damage};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_after_the_store_put_aborts_and_retries_without_a_false_duplicate() {
    let _serial = serial().await;
    let app = App::with_partitions("retry", 1).await;
    let t0 = now_ms();
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "fail-after-put=2")]);
    p.wait_ready(MINUTE);
    app.produce(&[
        Input::cmd("before", t0),
        Input::cmd("flaky", t0 + 1).header("streamapp.fault", "fail-after-put"),
        Input::cmd("after", t0 + 2),
    ]);
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 3);
    assert_eq!(counts(&output).get("flaky"), Some(&1));
    assert!(
        app.read(&app.duplicates).is_empty(),
        "the aborted puts were never seen as duplicates"
    );
    let log = p.log_text();
    assert_eq!(
        log.matches("aborting the transaction").count(),
        2,
        "two injected failures, two aborts:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aborted_write_never_causes_a_false_duplicate_when_the_task_migrates_back() {
    // The incident: instance A puts the id and fails, the task moves to B which fails too,
    // then moves back to A with its old state dir, which must not hold the aborted put.
    let _serial = serial().await;
    let app = App::with_partitions("migrate", 1).await;
    let t0 = now_ms();
    let mut a = app.start("pod-a");
    a.wait_ready(MINUTE);
    app.produce(&[Input::cmd("warmup", t0)]);
    app.wait_for_records(&app.output, 1, MINUTE);
    app.wait_until_processed(MINUTE);
    let committed_by_a = app.read(&app.changelog()).len();

    // A dies right after staging the put of "cmd-x" (kill -9 semantics: abort()).
    let mut a = {
        a.kill9();
        app.start_with("pod-a", &[("STREAMAPP_FAULTS", "crash-after-put=1")])
    };
    a.wait_ready(MINUTE);
    app.produce(&[Input::cmd("cmd-x", t0 + 1).header("streamapp.fault", "crash-after-put")]);
    assert_ne!(a.wait_exit(MINUTE), Some(0), "A crashed after the put");

    // B takes the partition (after A's session times out) and dies the same way.
    let mut b = app.start_with("pod-b", &[("STREAMAPP_FAULTS", "crash-after-put=1")]);
    assert_ne!(
        b.wait_exit(2 * MINUTE),
        Some(0),
        "B crashed after the put:\n{}",
        b.log_tail()
    );

    // A's old store holds what A committed (the warm-up) and nothing of the aborted put, and
    // nothing was committed to the changelog after it: the two aborted transactions left only
    // aborted records and markers, which a read_committed restore skips.
    let before = inspect(&a.state);
    let task = &before["tasks"][0];
    assert_eq!(task["ids"], 1, "only the warm-up id: {task}");
    let store_offset = task["changelogOffset"].as_i64().unwrap();
    assert_eq!(
        app.read(&app.changelog()).len(),
        committed_by_a,
        "no committed changelog record after A's offset {store_offset}"
    );

    // A comes back with its old state dir and no faults.
    let mut a = app.start("pod-a");
    a.wait_ready(2 * MINUTE);
    let health = a.health();
    let t = &health.tasks[0];
    assert_eq!(
        t.opened,
        Some(StoreOpen::ReplayedTail),
        "A reopened its own store (no wipe, no rebuild)"
    );
    assert_eq!(
        t.restore.as_ref().unwrap().records_restored,
        0,
        "only the tail after A's own offset {store_offset} was replayed: nothing"
    );
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    assert_eq!(
        counts(&output).get("cmd-x"),
        Some(&1),
        "cmd-x output exactly once: {output:?}"
    );
    assert!(
        app.read(&app.duplicates).is_empty(),
        "cmd-x was never reported as a duplicate"
    );
    assert_eq!(
        app.read(&app.changelog()).len(),
        2,
        "aborted puts never reached the changelog"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aborted_put_is_not_a_duplicate_after_revoke_and_reassign_of_the_suspended_store() {
    // The incident inside one process: the put of cmd-x is staged, the stage after it fails, and
    // while the transaction aborts the group revokes the partition (its store is suspended,
    // kept open) and assigns it back. The same store, resumed, must not hold the aborted put.
    let _serial = serial().await;
    let app = App::with_partitions("resume", 2).await;
    let t0 = now_ms();
    let mut a = app.start_with("pod-a", &[("STREAMAPP_FAULTS", "fail-after-put=1")]);
    a.wait_ready(MINUTE);
    app.produce(&[
        Input::cmd("warm-0", t0).partition(0),
        Input::cmd("warm-1", t0).partition(1),
    ]);
    app.wait_until_processed(MINUTE);
    // The stage takes 8 s, then fails: B joins meanwhile, so the rebalance comes right after
    // the abort.
    app.produce(&[Input::cmd("cmd-x", t0 + 1)
        .partition(0)
        .header("streamapp.fault", "fail-after-put:8000")]);
    wait_for_log(&a, "stalling the enrich stage", MINUTE);
    let mut b = app.start("pod-b");
    b.wait_ready(2 * MINUTE);
    a.wait_ready(2 * MINUTE);
    app.wait_until_processed(MINUTE);

    let log = a.log_text();
    let failed = log
        .find("failing the enrich stage")
        .expect("the stage failed");
    let revoked = log[failed..]
        .find("partitions revoked")
        .map(|i| i + failed)
        .expect("revoked after the failure");
    assert!(
        log[revoked..].contains("tasks assigned active=[0]"),
        "partition 0 came back to A:
{}",
        a.log_tail()
    );
    let health = a.health();
    let t = health
        .tasks
        .iter()
        .find(|t| t.partition == 0)
        .expect("A owns partition 0");
    assert_eq!(
        t.opened,
        Some(StoreOpen::Resumed),
        "the suspended store was resumed"
    );
    let output = app.read(&app.output);
    assert_eq!(counts(&output).get("cmd-x"), Some(&1), "{output:?}");
    assert!(
        app.read(&app.duplicates).is_empty(),
        "the resumed store does not hold the aborted put"
    );
    assert_eq!(output.len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_while_a_store_is_suspended_is_reported_as_an_unclean_shutdown() {
    let _serial = serial().await;
    let app = App::with_partitions("suspended", 2).await;
    let t0 = now_ms();
    let mut a = app.start_with("pod-a", &[("STREAMAPP_FAULTS", "crash-after-revoke=1")]);
    a.wait_ready(MINUTE);
    app.produce(
        &(0..100)
            .map(|i| Input::cmd(&format!("s-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    // B joins: A's stores are revoked (suspended, kept open) and A dies right then.
    let _b = app.start("pod-b");
    assert_ne!(a.wait_exit(MINUTE), Some(0), "A crashed while suspended");
    let report = inspect(&a.state);
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    for t in tasks {
        assert!(
            t["checkpoint"].is_null(),
            "no checkpoint vouches for a store that was open: {t}"
        );
    }
    let mut a = app.start("pod-a");
    a.wait_ready(2 * MINUTE);
    let health = a.health();
    assert_eq!(
        health.previous_shutdown_clean,
        Some(false),
        "a kill -9 is not a clean shutdown"
    );
    assert!(!health.tasks.is_empty());
    for t in &health.tasks {
        assert_eq!(
            t.opened,
            Some(StoreOpen::ReplayedTail),
            "partition {}: checked and replayed as after any crash",
            t.partition
        );
    }
    // Used at once, scanned for damage in the background.
    let health = a.wait_health("the background verification", MINUTE, |h| {
        h.tasks.iter().all(|t| {
            t.verification
                .as_ref()
                .is_some_and(|v| v.finished_at_ms.is_some())
        })
    });
    for t in &health.tasks {
        let v = t.verification.as_ref().unwrap();
        assert_eq!(v.reason, VerificationReason::UncleanShutdown);
        assert!(v.keys > 0, "partition {}: {v:?}", t.partition);
    }
    assert!(a.log_text().contains("store verified in the background"));
}

/// Recovery after kill -9 does not read the whole store first: the store is used as soon as
/// its tail is replayed, and its checksum scan runs in the background, paced (here 1000 keys a
/// second for ~30,000 keys: half a minute), then again every interval.
#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_the_store_serves_at_once_while_its_checksum_scan_runs_in_the_background() {
    let _serial = serial().await;
    let app = App::create(
        "bgverify",
        AppOptions {
            partitions: 1,
            rocksdb: serde_json::json!({
                "profile": "LowMemory",
                "verification": { "keysPerSecond": 1000, "intervalSeconds": 5 },
            }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let ids = |prefix: &str, n: i64| -> Vec<Input> {
        (0..n)
            .map(|i| Input::cmd(&format!("{prefix}-{i}"), t0 + i))
            .collect()
    };
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    // One key per id (store format 2): 30k keys, a scan of 30 s at 1000 keys a second.
    app.produce(&ids("v", 30_000));
    app.wait_until_processed(2 * MINUTE);
    p.kill9();

    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&[Input::cmd("after-the-crash", t0 + 40_000)]);
    app.wait_for_records(&app.output, 30_001, MINUTE);
    // The new id is out, and the scan of the store it was checked against is still running.
    let health = p.health();
    let task = &health.tasks[0];
    assert_eq!(task.opened, Some(StoreOpen::ReplayedTail));
    let v = task.verification.as_ref().expect("a scan started");
    assert_eq!(v.reason, VerificationReason::UncleanShutdown);
    assert_eq!(
        v.finished_at_ms, None,
        "processing did not wait for the scan: {v:?}"
    );

    let health = p.wait_health("the scan to pass", 2 * MINUTE, |h| {
        h.tasks[0]
            .verification
            .as_ref()
            .is_some_and(|v| v.finished_at_ms.is_some())
    });
    let v = health.tasks[0].verification.clone().unwrap();
    assert!(v.keys >= 30_000, "every key read: {v:?}");
    let took = v.finished_at_ms.unwrap() - v.started_at_ms;
    assert!(
        took >= 25_000,
        "paced at 1000 keys a second: {took} ms for {} keys",
        v.keys
    );
    assert_eq!(
        p.metric(r#"streamapp_processor_store_verifications_total{outcome="passed"}"#),
        Some(1.0)
    );
    // Five seconds later the periodic scan of the same store begins.
    let health = p.wait_health("the periodic scan", MINUTE, |h| {
        h.tasks[0]
            .verification
            .as_ref()
            .is_some_and(|v| v.reason == VerificationReason::Periodic)
    });
    assert!(health.tasks[0].quarantines.is_empty());
    // Exactly once across the crash.
    app.produce(&ids("v", 30_000));
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 30_001);
    assert!(counts(&output).values().all(|&n| n == 1));
    p.kill9();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_the_kafka_commit_and_the_store_apply_replays_the_tail_and_loses_nothing() {
    let _serial = serial().await;
    let app = App::with_partitions("applycrash", 1).await;
    let t0 = now_ms();
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "crash-after-commit=1")]);
    p.wait_ready(MINUTE);
    app.produce(
        &(0..50)
            .map(|i| Input::cmd(&format!("a-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    let mut batch: Vec<Input> = (50..100)
        .map(|i| Input::cmd(&format!("a-{i}"), t0 + i))
        .collect();
    batch[0] = batch[0]
        .clone()
        .header("streamapp.fault", "crash-after-commit");
    app.produce(&batch);
    assert_ne!(p.wait_exit(MINUTE), Some(0), "crashed after the commit");
    // Committed in Kafka (offsets, output, changelog), not applied to the store.
    let committed_output = app.read(&app.output).len();
    let report = inspect(&p.state);
    let ids_in_store = report["tasks"][0]["ids"].as_u64().unwrap() as usize;
    assert!(
        ids_in_store < committed_output,
        "the store missed the last transaction: {ids_in_store} ids, {committed_output} committed"
    );
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let health = p.health();
    let restored = health.tasks[0].restore.as_ref().unwrap().records_restored as usize;
    assert_eq!(health.tasks[0].opened, Some(StoreOpen::ReplayedTail));
    assert_eq!(
        restored,
        committed_output - ids_in_store,
        "exactly the committed tail was replayed"
    );
    // Every id once, whatever was still to process; every repeat a duplicate.
    app.produce(
        &(0..100)
            .map(|i| Input::cmd(&format!("a-{i}"), t0 + 1000 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 100, "nothing lost, nothing doubled");
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(app.read(&app.duplicates).len(), 100);
}

/// A panic on the state updater's thread (a defect in the restore path) must not leave the
/// task restoring for good: the engine notices, starts over, and the restore it begins again
/// catches the store up with the changelog.
#[tokio::test(flavor = "multi_thread")]
async fn a_panic_in_the_state_updater_restarts_the_engine_and_the_restore_completes() {
    let _serial = serial().await;
    let app = App::with_partitions("updaterpanic", 1).await;
    let t0 = now_ms();
    let mut first = app.start("pod-0");
    first.wait_ready(MINUTE);
    app.produce(
        &(0..100)
            .map(|i| Input::cmd(&format!("p-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    first.drain_and_exit();

    // Another pod, with an empty state directory: its store is restored from the changelog,
    // and the first restore panics the thread that runs it.
    let mut p = app.start_with("pod-1", &[("STREAMAPP_FAULTS", "panic-in-restore=1")]);
    p.wait_ready(MINUTE);
    let log = p.log_text();
    assert_eq!(
        log.matches("fault injection: the state updater panics")
            .count(),
        1,
        "one injected panic:\n{log}"
    );
    assert!(
        log.contains("the state updater's thread state-updater panicked")
            && log.contains("engine failed; restarting it"),
        "the engine noticed and started over:\n{log}"
    );
    let health = p.health();
    assert_eq!(
        health.tasks[0].restore.as_ref().unwrap().records_restored,
        100,
        "the restarted engine restored the whole changelog"
    );
    // The restored store knows every id: each is a duplicate now, and a new one is not.
    app.produce(
        &(0..101)
            .map(|i| Input::cmd(&format!("p-{i}"), t0 + 1000 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.duplicates).len(), 100);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 101);
    assert!(counts(&output).values().all(|&n| n == 1));
    p.drain_and_exit();
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_points_keeps_exactly_once_and_replays_only_the_changelog_tail() {
    let _serial = serial().await;
    let app = App::with_partitions("kill9", 2).await;
    let t0 = now_ms();
    let mut rng = rand::rng();
    let mut produced = 0;
    let mut distinct = std::collections::HashSet::new();
    let mut replayed = Vec::new();
    // The soak test adds many more kill -9s under load; here each round checks the restore.
    let total_rounds = 12;
    for round in 0..total_rounds {
        let mut p = app.start("pod-0");
        p.wait_ready(2 * MINUTE);
        if round > 0 {
            let health = p.health();
            for task in &health.tasks {
                assert_ne!(
                    task.opened,
                    Some(StoreOpen::FullRestore),
                    "round {round}: never a wipe"
                );
                assert_ne!(
                    task.opened,
                    Some(StoreOpen::Rebuilt),
                    "round {round}: no damage from kill -9"
                );
                replayed.push(task.restore.as_ref().map_or(0, |r| r.records_restored));
            }
        }
        // 250 records per round, 30% repeats of earlier ids, produced while the processor runs;
        // then kill -9 after a random delay (mid-transaction or between transactions).
        let batch: Vec<Input> = (0..250)
            .map(|i| {
                let id = if rng.random_bool(0.3) && produced > 0 {
                    format!("k-{}", rng.random_range(0..produced))
                } else {
                    format!("k-{}", produced + i)
                };
                Input::cmd(&id, t0 + (produced + i) as i64)
            })
            .collect();
        for r in &batch {
            distinct.insert(r.key.clone().unwrap());
        }
        produced += batch.len();
        app.produce(&batch);
        std::thread::sleep(Duration::from_millis(rng.random_range(0..600)));
        p.kill9();
    }
    let mut p = app.start("pod-0");
    p.wait_ready(2 * MINUTE);
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    let dups = app.read(&app.duplicates);
    assert_eq!(
        output.len(),
        distinct.len(),
        "each id exactly once after {total_rounds} kill -9s"
    );
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(
        output.len() + dups.len(),
        produced,
        "nothing lost, nothing doubled"
    );
    // Recovery replayed tails only: far fewer records than the changelog holds.
    let changelog_len = app.read(&app.changelog()).len();
    let max_replay = replayed.iter().copied().max().unwrap_or(0);
    assert!(
        (max_replay as usize) * 4 < changelog_len,
        "restores replayed at most {max_replay} records of a {changelog_len}-record changelog"
    );
    // The store agrees with the changelog once drained.
    assert!(p.drain().status.success());
    p.wait_exit(MINUTE);
    let report = inspect(&p.state);
    for task in report["tasks"].as_array().unwrap() {
        let partition = task["partition"].as_i64().unwrap() as i32;
        let end = testbed::kafka::end_offsets(&app.changelog())[partition as usize];
        assert!(
            task["changelogOffset"].as_i64().unwrap() >= end - 1,
            "store caught up with changelog partition {partition}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_move_between_processes_as_they_join_and_leave_and_exactly_once_holds() {
    let _serial = serial().await;
    let app = App::with_partitions("group", 4).await;
    let t0 = now_ms();
    let ids = |range: std::ops::Range<usize>| -> Vec<Input> {
        range
            .map(|i| Input::cmd(&format!("g-{i}"), t0 + i as i64))
            .collect()
    };
    // A alone owns all four tasks.
    let mut a = app.start("pod-a");
    a.wait_ready(MINUTE);
    app.produce(&ids(0..1000));
    app.wait_for_records(&app.output, 1000, MINUTE);

    // B joins: the group splits the tasks; B restores its share from the changelog.
    let mut b = app.start("pod-b");
    b.wait_ready(2 * MINUTE);
    let b_health = b.health();
    assert!(!b_health.tasks.is_empty(), "B got tasks");
    for task in &b_health.tasks {
        assert_eq!(
            task.opened,
            Some(StoreOpen::FullRestore),
            "a new owner restores partition {}",
            task.partition
        );
    }
    let restored: u64 = b_health
        .tasks
        .iter()
        .map(|t| t.restore.as_ref().unwrap().records_restored)
        .sum();
    assert!(restored > 0, "B's stores were built from the changelog");
    app.produce(&ids(500..1500)); // 500 repeats, 500 new
    app.wait_for_records(&app.output, 1500, MINUTE);

    // A leaves (drain): B takes every task and processes 500 new ids.
    assert!(a.drain().status.success());
    a.wait_exit(MINUTE);
    app.produce(&ids(1500..2000));
    app.wait_for_records(&app.output, 2000, 2 * MINUTE);

    // A comes back to its old state dir: for its tasks it replays only what B added meanwhile.
    let mut a = app.start("pod-a");
    a.wait_ready(2 * MINUTE);
    let a_health = a.health();
    let mut replayed = 0;
    for task in &a_health.tasks {
        assert_ne!(
            task.opened,
            Some(StoreOpen::FullRestore),
            "partition {}: the old store is reused",
            task.partition
        );
        replayed += task.restore.as_ref().unwrap().records_restored;
    }
    assert!(
        replayed <= 500,
        "A replayed {replayed} records: at most what B added while it was away"
    );

    app.produce(&ids(0..2000)); // all repeats
    app.wait_until_processed(2 * MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 2000, "each of the 2000 ids exactly once");
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(app.read(&app.duplicates).len(), 2500);
    a.kill9();
    b.kill9();
}

/// What each of RocksDB's WAL recovery modes makes of each kind of damage. The processor's part:
/// whatever RocksDB reports as damage is quarantined and rebuilt from the changelog (never a
/// crash loop), whatever it recovers is a consistent prefix whose changelog tail is replayed,
/// and either way the store ends consistent with the changelog.
fn expected_open(mode: &str, damage: Damage) -> StoreOpen {
    match (damage, mode) {
        // A torn last write, as a crash mid-append leaves: the two lenient modes recover the
        // prefix before it; AbsoluteConsistency refuses any inconsistency.
        (Damage::TruncateWal, "PointInTime" | "TolerateCorruptedTailRecords") => {
            StoreOpen::ReplayedTail
        }
        (Damage::TruncateWal, _) => StoreOpen::Rebuilt,
        // A damaged record in the middle of the log: PointInTime stops there (a consistent
        // prefix); TolerateCorruptedTailRecords tolerates only the tail, AbsoluteConsistency
        // nothing.
        (Damage::FlipWalBytes, "PointInTime") => StoreOpen::ReplayedTail,
        (Damage::FlipWalBytes, _) => StoreOpen::Rebuilt,
        // SST damage is no WAL matter: the background scan after an unclean stop (or the
        // first lookup that reads the block) finds the checksum mismatch, and a missing SST
        // fails the open, in every mode.
        (Damage::FlipSstBytes | Damage::DeleteSst, _) => StoreOpen::Rebuilt,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn damaged_wal_and_sst_files_recover_or_rebuild_as_each_recovery_mode_promises() {
    let _serial = serial().await;
    let mut app = App::with_partitions("corrupt", 1).await;
    let t0 = now_ms();
    // One store to damage: some data flushed to SST (a drain flushes), then more only in the
    // WAL (kill -9).
    let ids = |range: std::ops::Range<i64>, at: i64| -> Vec<Input> {
        range
            .map(|i| Input::cmd(&format!("c-{i}"), at + i))
            .collect()
    };
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids(0..300, t0));
    app.wait_until_processed(MINUTE);
    assert!(p.drain().status.success());
    p.wait_exit(MINUTE);
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&ids(300..600, t0));
    app.wait_until_processed(MINUTE);
    p.kill9();
    let original = p.state.clone();

    // Each case: a copy of that store, damaged, opened by the same pod in one recovery mode.
    let mut case = 0;
    for mode in [
        "PointInTime",
        "TolerateCorruptedTailRecords",
        "AbsoluteConsistency",
    ] {
        app.rewrite_config(|c| {
            c["rocksdb"] =
                serde_json::json!({ "profile": "LowMemory", "wal": { "recoveryMode": mode } });
        });
        for damage in [
            Damage::TruncateWal,
            Damage::FlipWalBytes,
            Damage::FlipSstBytes,
            Damage::DeleteSst,
        ] {
            case += 1;
            let what = format!("{mode} / {damage:?}");
            let state = app.dir.path().join(format!("case-{case}"));
            copy_dir(&original, &state);
            store_damage::damage(&state.join("tasks/0/store"), damage);
            let mut p = app.start_at("pod-0", &state, &[], &[]);
            p.wait_ready(2 * MINUTE);
            // A store opened after the crash is used at once and scanned in the background:
            // the verdict is in once that scan passed or the damage was rebuilt.
            let health = p.wait_health("the store's verdict", 2 * MINUTE, |h| {
                h.tasks.first().is_some_and(|t| {
                    let rebuilt =
                        t.opened == Some(StoreOpen::Rebuilt) && t.state == Some(TaskState::Active);
                    let verified = t
                        .verification
                        .as_ref()
                        .is_some_and(|v| v.finished_at_ms.is_some());
                    rebuilt || verified
                })
            });
            let task = &health.tasks[0];
            assert_eq!(task.opened, Some(expected_open(mode, damage)), "{what}");
            match task.opened {
                Some(StoreOpen::Rebuilt) => {
                    assert_eq!(
                        task.quarantines.len(),
                        1,
                        "{what}: the quarantine is reported"
                    );
                    assert!(
                        Path::new(&task.quarantines[0].path).exists(),
                        "{what}: the damaged store is kept"
                    );
                }
                _ => assert!(task.quarantines.is_empty(), "{what}: nothing quarantined"),
            }
            // Consistent with the changelog: every earlier id is a duplicate, a new one is
            // output once.
            let before = (app.read(&app.output).len(), app.read(&app.duplicates).len());
            let mut records = ids(0..600, t0 + 1000 * case);
            records.push(Input::cmd(&format!("fresh-{case}"), t0 + 1000 * case + 999));
            app.produce(&records);
            app.wait_until_processed(MINUTE);
            assert_eq!(
                app.read(&app.output).len(),
                before.0 + 1,
                "{what}: exactly once"
            );
            assert_eq!(
                app.read(&app.duplicates).len(),
                before.1 + 600,
                "{what}: the store remembers every committed id"
            );
            p.kill9();
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
