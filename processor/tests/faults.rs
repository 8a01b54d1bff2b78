//! Fault injection: failures after a store put, task migration with old state dirs, kill -9
//! in a loop, and damaged RocksDB files. Exactly-once must hold through all of it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{App, AppOptions, Input, counts, inspect, now_ms, serial};
use rand::RngExt;
use streamapp_api::health::StoreOpen;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_after_the_store_put_aborts_and_retries_without_a_false_duplicate() {
    let _serial = serial().await;
    let app = App::create(
        "retry",
        AppOptions {
            partitions: 1,
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "fail-after-put=2")]);
    p.wait_ready(MINUTE);
    app.produce(&[
        Input::cmd("before", t0),
        Input::cmd("flaky", t0 + 1).header("streamapp.fault", "fail-after-put"),
        Input::cmd("after", t0 + 2),
    ]);
    let output = app.wait_for_records(&app.output, 3, MINUTE);
    std::thread::sleep(Duration::from_secs(1));
    let output_now = app.read(&app.output);
    assert_eq!(output_now.len(), 3);
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
    let app = App::create(
        "migrate",
        AppOptions {
            partitions: 1,
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut a = app.start("pod-a");
    a.wait_ready(MINUTE);
    app.produce(&[Input::cmd("warmup", t0)]);
    app.wait_for_records(&app.output, 1, MINUTE);

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

    // A comes back with its old state dir and no faults.
    let mut a = app.start("pod-a");
    a.wait_ready(2 * MINUTE);
    let output = app.wait_for_records(&app.output, 2, 2 * MINUTE);
    std::thread::sleep(Duration::from_secs(2));
    let output_now = app.read(&app.output);
    assert_eq!(
        counts(&output_now).get("cmd-x"),
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
async fn kill_9_at_random_points_keeps_exactly_once_and_replays_only_the_changelog_tail() {
    let _serial = serial().await;
    let app = App::create(
        "kill9",
        AppOptions {
            partitions: 2,
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut rng = rand::rng();
    let mut produced = 0;
    let mut distinct = std::collections::HashSet::new();
    let mut replayed = Vec::new();
    let total_rounds = 20;
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
    let output = app.wait_for_records(&app.output, distinct.len(), 2 * MINUTE);
    std::thread::sleep(Duration::from_secs(2));
    let output_now = app.read(&app.output);
    let dups = app.read(&app.duplicates);
    assert_eq!(
        output_now.len(),
        distinct.len(),
        "each id exactly once after 20 kill -9s"
    );
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(
        output_now.len() + dups.len(),
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
        let end = changelog_end(&app.changelog(), partition);
        assert!(
            task["changelogOffset"].as_i64().unwrap() >= end - 1,
            "store caught up with changelog partition {partition}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_move_between_processes_as_they_join_and_leave_and_exactly_once_holds() {
    let _serial = serial().await;
    let app = App::create(
        "group",
        AppOptions {
            partitions: 4,
            ..Default::default()
        },
    )
    .await;
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
    app.wait_for_records(&app.duplicates, 2500, 2 * MINUTE);
    std::thread::sleep(Duration::from_secs(2));
    let output = app.read(&app.output);
    assert_eq!(output.len(), 2000, "each of the 2000 ids exactly once");
    assert!(counts(&output).values().all(|&n| n == 1));
    assert_eq!(app.read(&app.duplicates).len(), 2500);
    a.kill9();
    b.kill9();
}

/// How a test damages a stopped processor's store.
#[derive(Clone, Copy, Debug)]
enum Damage {
    TruncateWal,
    FlipWalBytes,
    FlipSstBytes,
    DeleteSst,
}

#[tokio::test(flavor = "multi_thread")]
async fn damaged_wal_and_sst_files_end_consistent_in_every_recovery_mode_without_a_crash_loop() {
    let _serial = serial().await;
    for mode in [
        "PointInTime",
        "TolerateCorruptedTailRecords",
        "AbsoluteConsistency",
    ] {
        for damage in [
            Damage::TruncateWal,
            Damage::FlipWalBytes,
            Damage::FlipSstBytes,
            Damage::DeleteSst,
        ] {
            damaged_store_recovers(mode, damage).await;
        }
    }
}

async fn damaged_store_recovers(mode: &str, damage: Damage) {
    let app = App::create(
        "corrupt",
        AppOptions {
            partitions: 1,
            rocksdb: serde_json::json!({ "profile": "LowMemory", "wal": { "recoveryMode": mode } }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    // Some data flushed to SST (a drain flushes), then more only in the WAL (kill -9).
    app.produce(
        &(0..300)
            .map(|i| Input::cmd(&format!("c-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_for_records(&app.output, 300, MINUTE);
    assert!(p.drain().status.success());
    p.wait_exit(MINUTE);
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(
        &(300..600)
            .map(|i| Input::cmd(&format!("c-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_for_records(&app.output, 600, MINUTE);
    std::thread::sleep(Duration::from_millis(500));
    p.kill9();

    let store = p.state.join("tasks/0/store");
    damage_store(&store, damage);

    let mut p = app.start("pod-0");
    p.wait_ready(2 * MINUTE);
    let health = p.health();
    let task = &health.tasks[0];
    let what = format!("{mode} / {damage:?}");
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
        Some(StoreOpen::ReplayedTail) => assert!(task.quarantines.is_empty(), "{what}"),
        other => panic!("{what}: unexpected open {other:?}"),
    }
    // Consistent with the changelog: every old id is a duplicate, new ids are output once.
    app.produce(
        &(0..600)
            .map(|i| Input::cmd(&format!("c-{i}"), t0 + 1000 + i))
            .collect::<Vec<_>>(),
    );
    app.produce(&[Input::cmd("fresh", t0 + 2000)]);
    app.wait_for_records(&app.output, 601, MINUTE);
    app.wait_for_records(&app.duplicates, 600, MINUTE);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(app.read(&app.output).len(), 601, "{what}: exactly once");
    assert_eq!(
        app.read(&app.duplicates).len(),
        600,
        "{what}: the store remembers every committed id"
    );
    p.kill9();
}

fn damage_store(store: &Path, damage: Damage) {
    let files: Vec<_> = std::fs::read_dir(store)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let newest = |ext: &str| {
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .max_by_key(|p| std::fs::metadata(p).unwrap().len())
            .cloned()
            .unwrap_or_else(|| panic!("no .{ext} file in {}", store.display()))
    };
    match damage {
        Damage::TruncateWal => {
            let wal = newest("log");
            let len = std::fs::metadata(&wal).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&wal)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }
        Damage::FlipWalBytes => flip_bytes(&newest("log")),
        Damage::FlipSstBytes => flip_bytes(&newest("sst")),
        Damage::DeleteSst => std::fs::remove_file(newest("sst")).unwrap(),
    }
}

fn flip_bytes(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 3;
    let end = (mid + 64).min(bytes.len());
    for b in &mut bytes[mid..end] {
        *b ^= 0xA5;
    }
    std::fs::write(path, bytes).unwrap();
}

fn changelog_end(topic: &str, partition: i32) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = testbed::kafka::client_config().create().unwrap();
    c.fetch_watermarks(topic, partition, Duration::from_secs(10))
        .unwrap()
        .1
}
