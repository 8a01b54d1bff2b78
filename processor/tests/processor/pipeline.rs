//! The dedup topology against the real broker: exactly-once output, dead letters, retention,
//! drain and checkpoints, fencing, and the changelog's partition check.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{App, AppOptions, Input, counts, inspect, now_ms, serial};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn each_id_is_output_exactly_once_and_repeats_go_to_the_duplicates_topic() {
    let _serial = serial().await;
    let app = App::create("eos", AppOptions::default()).await;
    let t0 = now_ms();
    // 700 distinct ids, 300 repeats (30%): some repeat right after (same transaction: the
    // staged put must be visible to the next lookup), some much later.
    let mut records = Vec::new();
    for i in 0..700 {
        records.push(Input::cmd(&format!("cmd-{i}"), t0 + i));
        if i % 7 < 2 {
            records.push(Input::cmd(&format!("cmd-{i}"), t0 + i)); // immediate repeat
        }
    }
    for i in 0..100 {
        records.push(Input::cmd(&format!("cmd-{}", i * 7 % 700), t0 + 1000 + i)); // later repeat
    }
    assert_eq!(records.len(), 1000);
    let expected_dups = records.len() - 700;

    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&records);
    // Everything processed and committed: reading to the end shows every result, so an
    // extra record would be there.
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    let dups = app.read(&app.duplicates);

    let per_id = counts(&output);
    assert_eq!(output.len(), 700, "every id exactly once");
    assert!(per_id.values().all(|&n| n == 1));
    assert_eq!(per_id.len(), 700);
    assert_eq!(dups.len(), expected_dups);
    assert!(app.read(&app.dead_letters).is_empty());
    // Output records carry the input's value and the dedup id header.
    assert!(
        output
            .iter()
            .all(|o| o.value.as_ref().is_some_and(|v| v.starts_with(b"{\"id\"")))
    );

    // The store agrees with the changelog: 700 ids, offsets stored.
    let drained = p.drain();
    assert!(
        drained.status.success(),
        "drain: {}",
        String::from_utf8_lossy(&drained.stderr)
    );
    assert_eq!(p.wait_exit(MINUTE), Some(0));
    let report = inspect(&p.state);
    let ids: u64 = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ids"].as_u64().unwrap())
        .sum();
    assert_eq!(ids, 700, "the store holds every first occurrence");
    let changelog = app.read(&app.changelog());
    assert_eq!(
        changelog.len(),
        700,
        "one changelog record per first occurrence"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_sends_what_the_producer_lingers_on_instead_of_waiting_out_linger_ms() {
    let _serial = serial().await;
    // linger.ms just under the transaction timeout (10 s; librdkafka wants it below its
    // message timeout, which a transactional producer bounds by the transaction timeout).
    let linger = Duration::from_secs(8);
    let app = App::create(
        "linger",
        AppOptions {
            // The id from the value: the route stage repartitions by it, so each record
            // passes through two transactions.
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            kafka_properties: serde_json::json!({ "linger.ms": linger.as_millis().to_string() }),
            ..Default::default()
        },
    )
    .await;
    assert!(app.repartitions());
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let t0 = now_ms();
    let records: Vec<Input> = (0..20)
        .map(|i| Input::cmd(&format!("linger-{i}"), t0 + i))
        .collect();
    app.produce(&records);
    // A commit that waited for the producer's batches to linger would hold each record for
    // at least 8 s in its route transaction and 8 s more in its dedup transaction.
    let output = app.wait_for_records(&app.output, records.len(), linger * 3 / 4);
    assert_eq!(counts(&output).len(), records.len(), "every id, once");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_records_go_to_the_dead_letter_topic_with_a_reason_and_nothing_is_lost() {
    let _serial = serial().await;
    let app = App::create(
        "dlq",
        AppOptions {
            partitions: 1,
            max_value_size: "1Ki",
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            ..Default::default()
        },
    )
    .await;
    let t0 = now_ms();
    let mut records: Vec<Input> = (0..20)
        .map(|i| Input::cmd(&format!("ok-{i}"), t0 + i))
        .collect();
    records.push(Input {
        key: Some("k".into()),
        value: Some(b"{not json".to_vec()),
        time: t0,
        ..Default::default()
    });
    records.push(Input {
        key: Some("k".into()),
        value: Some(br#"{"other":1}"#.to_vec()),
        time: t0,
        ..Default::default()
    });
    let mut big = br#"{"id":"big","pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 2048));
    big.extend(br#""}"#);
    records.push(Input {
        key: Some("k".into()),
        value: Some(big),
        time: t0,
        ..Default::default()
    });
    records.push(Input::cmd("ok-3", t0 + 50)); // a duplicate too
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&records);

    app.wait_until_processed(MINUTE);
    let dlq = app.read(&app.dead_letters);
    let output = app.read(&app.output);
    let dups = app.read(&app.duplicates);
    let reasons: HashSet<_> = dlq
        .iter()
        .map(|d| d.headers["streamapp.dlq.reason"].clone())
        .collect();
    assert_eq!(
        reasons,
        HashSet::from([
            "invalid-json".to_string(),
            "missing-dedup-id".into(),
            "value-too-large".into()
        ])
    );
    assert!(
        dlq.iter()
            .all(|d| d.headers["streamapp.dlq.source"].starts_with(&app.input))
    );
    let too_large = dlq
        .iter()
        .find(|d| d.headers["streamapp.dlq.reason"] == "value-too-large")
        .unwrap();
    assert_eq!(
        too_large.value, None,
        "metadata only: the value is what was too large"
    );
    assert!(
        too_large.headers["streamapp.dlq.original-size"]
            .parse::<usize>()
            .unwrap()
            > 2048
    );
    assert_eq!(
        output.len() + dups.len() + dlq.len(),
        records.len(),
        "input = output + duplicates + dead letters"
    );
    assert!(p.is_ready(), "the pipeline keeps running");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_id_seen_after_the_retention_is_processed_again_and_expired_ids_leave_the_store() {
    let _serial = serial().await;
    let app = App::create(
        "retention",
        AppOptions {
            partitions: 1,
            retention: "10m",
            ..Default::default()
        },
    )
    .await;
    let minute = 60_000;
    let t0 = now_ms() - 120 * minute;
    // 200 ids at record time t0, then the same ids 5 min later (duplicates), then again
    // 11 min after first seen (new), then 300 fresh ids an hour later that push stream time
    // far past everything else.
    let mut records: Vec<Input> = (0..200)
        .map(|i| Input::cmd(&format!("r-{i}"), t0))
        .collect();
    records.extend((0..200).map(|i| Input::cmd(&format!("r-{i}"), t0 + 5 * minute)));
    records.extend((0..200).map(|i| Input::cmd(&format!("r-{i}"), t0 + 11 * minute)));
    records.extend((0..300).map(|i| Input::cmd(&format!("later-{i}"), t0 + 60 * minute)));
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(&records);
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    let dups = app.read(&app.duplicates);
    assert_eq!(output.len(), 700, "200 + 200 again after the window + 300");
    let per_id = counts(&output);
    assert_eq!(
        per_id["r-0"], 2,
        "seen again after the window: processed again"
    );
    assert_eq!(per_id["later-0"], 1);
    assert_eq!(
        dups.len(),
        200,
        "only the repeats inside the window are duplicates"
    );

    p.drain_and_exit();
    let report = inspect(&p.state);
    // The store is bounded by the window: the 200 early ids expired once stream time moved an
    // hour on; only the 300 later ids remain.
    assert_eq!(report["tasks"][0]["ids"], 300, "expired ids were dropped");
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_writes_a_checkpoint_and_a_restart_restores_nothing_then_removes_it() {
    let _serial = serial().await;
    let app = App::create("drain", AppOptions::default()).await;
    let t0 = now_ms();
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    app.produce(
        &(0..300)
            .map(|i| Input::cmd(&format!("d-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_for_records(&app.output, 300, MINUTE);

    let out = p.drain();
    assert!(
        out.status.success(),
        "drain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));
    assert_eq!(
        p.wait_exit(MINUTE),
        Some(0),
        "a drained processor exits cleanly"
    );
    let health = p.health();
    assert_eq!(health.phase, streamapp_api::health::ProcessorPhase::Drained);
    assert!(health.drain_duration_ms.is_some());
    let report = inspect(&p.state);
    for task in report["tasks"].as_array().unwrap() {
        let checkpoint = task["checkpoint"]
            .as_array()
            .expect("a checkpoint per task");
        let changelog_entry = checkpoint
            .iter()
            .find(|e| e[0] == app.changelog())
            .expect("changelog offset");
        assert_eq!(
            changelog_entry[2], task["changelogOffset"],
            "checkpoint matches the store's own offset"
        );
        assert!(
            checkpoint.iter().any(|e| e[0] == app.input.as_str()),
            "input offset in the checkpoint"
        );
    }

    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let health = p.health();
    assert_eq!(health.previous_shutdown_clean, Some(true));
    for task in &health.tasks {
        assert_eq!(task.opened, Some(streamapp_api::health::StoreOpen::Clean));
        assert_eq!(
            task.restore.as_ref().unwrap().records_restored,
            0,
            "a drained store restores nothing"
        );
    }
    let report = inspect(&p.state);
    assert!(
        report["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["checkpoint"].is_null()),
        "checkpoints removed once processing resumed"
    );
    // Still exactly once after the restart.
    app.produce(
        &(0..300)
            .map(|i| Input::cmd(&format!("d-{i}"), t0 + 1000 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.duplicates).len(), 300);
    assert_eq!(app.read(&app.output).len(), 300);
}

/// A second pod that joins while the first still creates its stores takes a partition whose
/// new store was not open yet. The first pod closes that empty store when it arrives; after its
/// drain, its next start must still find a clean shutdown (every task directory with a
/// checkpoint), not one that looks like a crash.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_revoked_while_it_was_being_created_leaves_the_next_start_clean() {
    let _serial = serial().await;
    let app = App::create(
        "revokedopen",
        AppOptions {
            partitions: 2,
            ..Default::default()
        },
    )
    .await;
    let mut first = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "slow-open=10000")]);
    common::wait_for_log(&first, "fault injection: opening the store slowly", MINUTE);
    let mut second = app.start("pod-1");
    second.wait_ready(MINUTE);
    first.wait_ready(MINUTE);
    common::wait_for_log(
        &first,
        "closing a store opened for a task that no longer waits for it",
        MINUTE,
    );
    let kept = first.health().tasks.len();
    assert_eq!(kept, 1, "the second pod took one of the two partitions");
    let tasks = std::fs::read_dir(first.state.join("tasks"))
        .unwrap()
        .count();
    assert_eq!(
        tasks, 2,
        "both partitions' stores were created on the first pod"
    );

    first.drain_and_exit();
    let mut again = app.start("pod-0");
    again.wait_ready(MINUTE);
    assert_eq!(again.health().previous_shutdown_clean, Some(true));
    second.drain_and_exit();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_process_with_the_same_pod_identity_fences_the_first() {
    let _serial = serial().await;
    let app = App::with_partitions("fence", 1).await;
    let t0 = now_ms();
    let mut old = app.start("pod-0");
    old.wait_ready(MINUTE);
    app.produce(
        &(0..100)
            .map(|i| Input::cmd(&format!("f-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    app.wait_for_records(&app.output, 100, MINUTE);

    // Same pod identity, another state dir (as a stuck old pod and its replacement would).
    let replacement = clone_app(&app);
    let mut new = replacement.start("pod-0");
    app.produce(
        &(100..200)
            .map(|i| Input::cmd(&format!("f-{i}"), t0 + i))
            .collect::<Vec<_>>(),
    );
    let code = old.wait_exit(MINUTE);
    assert_eq!(
        code,
        Some(3),
        "the older instance stops with the 'fenced' exit code:\n{}",
        old.log_tail()
    );
    assert!(
        old.log_text().contains("fenced"),
        "says why:\n{}",
        old.log_tail()
    );
    new.wait_ready(MINUTE);
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 200, "no duplicate output");
    assert!(counts(&output).values().all(|&n| n == 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn start_up_fails_with_a_clear_message_when_the_changelog_partitions_differ_from_the_input() {
    let _serial = serial().await;
    let app = App::with_partitions("mismatch", 3).await;
    testbed::kafka::create_topic(&app.changelog(), 2).await;
    let mut p = app.start("pod-0");
    let code = p.wait_exit(MINUTE);
    assert_eq!(code, Some(2), "a start-up refusal");
    let log = p.log_text();
    assert!(
        log.contains(&format!(
            "changelog topic {} has 2 partitions but input topic {} has 3",
            app.changelog(),
            app.input
        )),
        "unexpected message:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_configuration_is_refused_naming_the_field() {
    let _serial = serial().await;
    let app = App::create(
        "badconfig",
        AppOptions {
            partitions: 1,
            retention: "50ms",
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start("pod-0");
    p.assert_refused_at_start_up(
        "topology.retention: must be greater than topology.commitInterval",
    );
}

fn clone_app(app: &App) -> App {
    App {
        id: app.id.clone(),
        input: app.input.clone(),
        output: app.output.clone(),
        duplicates: app.duplicates.clone(),
        dead_letters: app.dead_letters.clone(),
        partitions: app.partitions,
        dir: tempfile::tempdir().unwrap(),
        config: app.config.clone(),
        config_json: app.config_json.clone(),
    }
}
