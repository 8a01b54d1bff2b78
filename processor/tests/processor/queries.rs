//! The read-only queries. The id lookup (`GET /lookup`): its answers agree with what the
//! output, duplicates and dead-letter topics hold, on an active store, on a standby, and on a
//! store rebuilt from the changelog; an id of a transaction still open is not seen. The
//! dead-letter listing (`GET /dead-letters`): each reason, the filters, nothing left behind
//! in Kafka. Bad queries are refused, saying why.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use streamapp_api::dead_letters::{self, Listing};
use streamapp_api::health::TaskState;
use streamapp_api::lookup::{self, Answer, Found};
use testbed::kafka::{self, Isolation};

use crate::common::*;

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: i64 = 3_600_000;

fn look_up(p: &Processor, ids: &[&str]) -> Answer {
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let (status, body) = p
        .get(&format!("{}?{}", lookup::PATH, lookup::query(&ids)))
        .expect("/lookup answers");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/lookup answers JSON")
}

/// The one sighting of `id` in `answer`, if a store of the pod holds it.
fn found<'a>(answer: &'a Answer, id: &str) -> Option<&'a Found> {
    let entry = answer.ids.iter().find(|a| a.id == id).expect("asked");
    assert!(entry.found.len() <= 1, "{entry:?}");
    entry.found.first()
}

/// id → (partition, offset) of its first record in the input topic.
fn first_in_input(app: &App) -> HashMap<String, (i32, i64)> {
    let mut first = HashMap::new();
    kafka::read_all(&app.input, Isolation::ReadCommitted, |m| {
        use rdkafka::Message;
        let id = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        let at = (m.partition(), m.offset());
        first
            .entry(id)
            .and_modify(|e: &mut (i32, i64)| *e = (*e).min(at))
            .or_insert(at);
    });
    first
}

/// Polls both pods until `check` holds for their answers about `ids`.
fn wait_answers(
    pods: &[&Processor],
    ids: &[&str],
    what: &str,
    check: impl Fn(&[Answer]) -> bool,
) -> Vec<Answer> {
    let deadline = Instant::now() + MINUTE;
    loop {
        let answers: Vec<Answer> = pods.iter().map(|p| look_up(p, ids)).collect();
        if check(&answers) {
            return answers;
        }
        assert!(Instant::now() < deadline, "{what}: {answers:#?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_agree_with_the_topics_on_actives_standbys_and_rebuilt_stores() {
    let _serial = serial().await;
    let app = App::create(
        "lookup",
        AppOptions {
            partitions: 2,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            extra: serde_json::json!({ "group": { "standbyReplicas": 1 } }),
            ..Default::default()
        },
    )
    .await;
    assert!(
        app.repartitions(),
        "the route stage decides each id's partition"
    );
    let faults = [(streamapp_processor::faults::ENV, "stall-after-put=1")];
    let mut a = app.start_with("pod-a", &faults);
    let mut b = app.start_with("pod-b", &faults);
    a.wait_ready(MINUTE);
    b.wait_ready(MINUTE);

    let now = now_ms();
    // Two hours old first, then records of now on both partitions: "old" is past the window
    // of its store's stream time (1 h retention) but not compacted away.
    app.produce(&[Input::cmd("old", now - 2 * HOUR)]);
    app.wait_until_processed(MINUTE);
    let fresh: Vec<String> = (0..20).map(|i| format!("once-{i}")).collect();
    let mut records: Vec<Input> = fresh.iter().map(|id| Input::cmd(id, now)).collect();
    records.push(Input::cmd("twice", now));
    records.push(Input::cmd("twice", now + 1));
    // Dead-lettered: beyond the clock plus the 5 min skew (the broker takes up to an hour).
    records.push(Input::cmd("future", now + HOUR / 2));
    app.produce(&records);
    app.wait_until_processed(MINUTE);
    let output = counts(&app.read(&app.output));
    assert_eq!(output.get("twice"), Some(&1));
    assert_eq!(counts(&app.read(&app.duplicates)).get("twice"), Some(&1));
    assert_eq!(app.read(&app.dead_letters).len(), 1, "future");
    let first = first_in_input(&app);

    let mut ids: Vec<&str> = fresh.iter().map(String::as_str).collect();
    ids.extend(["twice", "old", "future", "never"]);
    // Every pod holds each partition, active or standby: wait until the standbys caught up
    // and the assignment settled (one pod the active of a partition, the other its standby).
    let settled = |answers: &[Answer], id: &str| {
        let mut states: Vec<String> = answers
            .iter()
            .filter_map(|ans| found(ans, id))
            .map(|f| format!("{:?}", f.state))
            .collect();
        states.sort();
        states == ["Some(Active)", "Some(Standby)"]
    };
    let answers = wait_answers(
        &[&a, &b],
        &ids,
        "both pods answer for every id",
        |answers| {
            ["twice", "once-0", "once-1", "old"]
                .iter()
                .all(|id| settled(answers, id))
        },
    );
    for answer in &answers {
        for id in fresh.iter().map(String::as_str).chain(["twice"]) {
            let f = found(answer, id).unwrap_or_else(|| panic!("{id} on {}", answer.pod));
            let (partition, offset) = first[id];
            assert_eq!(f.first_seen, now, "{id}: the first occurrence's time");
            assert_eq!(f.expires_at, f.first_seen + HOUR);
            assert!(!f.expired, "{id}");
            let source = f
                .source
                .as_ref()
                .expect("a format 2 store knows the source");
            assert_eq!(
                (source.topic.as_str(), source.partition, source.offset),
                (app.input.as_str(), partition, offset),
                "{id}: the first occurrence's input record"
            );
            assert_eq!(
                answer.ids.iter().find(|x| x.id == id).unwrap().partition,
                Some(f.partition)
            );
        }
        let old = found(answer, "old").unwrap();
        assert!(old.expired, "past the window: a repeat now would be output");
        for id in ["future", "never"] {
            let entry = answer.ids.iter().find(|x| x.id == id).unwrap();
            assert!(entry.found.is_empty(), "{entry:?}");
            assert_eq!(entry.asked.len(), 1, "only the id's own partition is asked");
        }
    }
    // An id of a transaction still open: its changelog record is written (uncommitted), the
    // stage stalls before the output; no pod has it yet.
    app.produce(&[Input::cmd("stalled", now).header("streamapp.fault", "stall-after-put:6000")]);
    let deadline = Instant::now() + MINUTE;
    loop {
        let mut written = false;
        kafka::read_all(&app.changelog(), Isolation::ReadUncommitted, |m| {
            use rdkafka::Message;
            written |= m.key() == Some(b"stalled".as_slice());
        });
        if written {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stalled transaction wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in [&a, &b] {
        assert_eq!(
            found(&look_up(p, &["stalled"]), "stalled"),
            None,
            "uncommitted"
        );
    }
    assert_eq!(counts(&app.read(&app.output)).get("stalled"), None);
    wait_answers(&[&a, &b], &["stalled"], "seen once committed", |ans| {
        settled(ans, "stalled")
    });
    ids.push("stalled");
    let before: Vec<Answer> = [&a, &b].iter().map(|p| look_up(p, &ids)).collect();

    // Both pods gone with their volumes: a new pod rebuilds both stores from the changelog
    // and answers the same, sources included.
    a.drain_and_exit();
    b.drain_and_exit();
    std::fs::remove_dir_all(app.state_dir("pod-a")).unwrap();
    std::fs::remove_dir_all(app.state_dir("pod-b")).unwrap();
    let mut c = app.start("pod-c");
    c.wait_ready(MINUTE);
    // Ready says every task pod-c owns at that moment is active, not that its share is final:
    // one CI run saw a store Restored in the first lookup after ready (its log is not kept).
    // The comparison is of the settled pod: both stores active.
    let rebuilt = wait_answers(&[&c], &ids, "pod-c's two stores active", |answers| {
        let stores = &answers[0].stores;
        stores.len() == 2 && stores.iter().all(|s| s.state == Some(TaskState::Active))
    })
    .remove(0);
    // Whether a rebuilt store still holds an expired id depends on how the restore batched
    // it with later records; either way it is not remembered.
    assert!(
        found(&rebuilt, "old").is_none_or(|f| f.expired),
        "{rebuilt:?}"
    );
    for id in ids.iter().filter(|id| **id != "old") {
        let was = before
            .iter()
            .find_map(|ans| found(ans, id))
            .map(|f| (f.partition, f.first_seen, f.expired, f.source.clone()));
        let now_found = found(&rebuilt, id).map(|f| {
            assert_eq!(f.state, Some(TaskState::Active));
            (f.partition, f.first_seen, f.expired, f.source.clone())
        });
        assert_eq!(
            now_found, was,
            "{id}: the rebuilt store answers as the live ones did"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_lookups_are_refused_saying_why() {
    let _serial = serial().await;
    let app = App::with_partitions("lookup-bad", 1).await;
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let ids = |n: usize| {
        (0..n)
            .map(|i| format!("id=x{i}"))
            .collect::<Vec<_>>()
            .join("&")
    };
    let long = format!("id={}", "a".repeat(lookup::MAX_ID_BYTES + 1));
    for (query, says) in [
        ("".to_string(), "no id"),
        ("id=".to_string(), "an empty id"),
        ("id=%FF%FE".to_string(), "not UTF-8"),
        ("who=x".to_string(), "unknown query parameter"),
        (ids(lookup::MAX_IDS + 1), "101 ids in one request"),
        (long, "the longest an id may be"),
    ] {
        let (status, body) = p
            .get(&format!("{}?{query}", lookup::PATH))
            .expect("answers");
        assert_eq!((status, body.contains(says)), (400, true), "{body}");
    }
    // Ten thousand ids: the HTTP server refuses the URI (longer than 64 KiB) before any
    // handler reads it. (The plugin refuses it, and a megabyte of id, before asking.)
    let uri = format!("{}?{}", lookup::PATH, ids(10_000));
    assert_eq!(p.get(&uri).map(|(status, _)| status), Some(414));
    assert!(p.is_ready(), "and the processor goes on");
}

fn list_dead_letters(p: &Processor, query: &dead_letters::Query) -> Listing {
    let (status, body) = p
        .get(&format!("{}?{}", dead_letters::PATH, query.to_query()))
        .expect("/dead-letters answers");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/dead-letters answers JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_listed_with_their_reasons_and_filters_and_leave_nothing_in_kafka() {
    let _serial = serial().await;
    let app = App::create(
        "dead-letters",
        AppOptions {
            partitions: 1,
            dedup_id: serde_json::json!({ "source": "JsonPointer", "jsonPointer": "/id" }),
            max_value_size: "1k",
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let now = now_ms();
    let raw = |value: &[u8], time| Input {
        key: Some("k".into()),
        value: Some(value.to_vec()),
        time,
        ..Default::default()
    };
    app.produce(&[
        Input::cmd("fine", now),
        raw(b"{not json", now),
        raw(br#"{"no":"id"}"#, now),
        raw(&vec![b'x'; 2048], now),
        Input::cmd("future", now + HOUR / 2),
    ]);
    app.wait_until_processed(MINUTE);
    assert_eq!(app.read(&app.dead_letters).len(), 4);

    let all = list_dead_letters(&p, &dead_letters::Query::default());
    assert!(all.complete, "{all:?}");
    assert_eq!(all.scanned, 4);
    assert_eq!(all.topic, app.dead_letters);
    let reasons: Vec<_> = all
        .dead_letters
        .iter()
        .map(|d| d.reason.clone().unwrap())
        .collect();
    assert_eq!(
        reasons,
        [
            "invalid-json",
            "missing-dedup-id",
            "value-too-large",
            "timestamp-too-far-ahead"
        ],
        "oldest first"
    );
    let json = &all.dead_letters[0];
    assert_eq!(json.value_prefix.as_deref(), Some("{not json"));
    assert_eq!(
        json.source.as_deref(),
        Some(format!("{}/0/1", app.input).as_str())
    );
    assert!(
        json.error
            .as_deref()
            .is_some_and(|e| e.contains("not valid JSON")),
        "{json:?}"
    );
    let large = &all.dead_letters[2];
    assert_eq!(
        large.size, 2048,
        "the original's size: only its metadata was written"
    );
    assert_eq!(large.value_prefix, None);

    let only = list_dead_letters(
        &p,
        &dead_letters::Query {
            reason: Some("missing-dedup-id".into()),
            ..Default::default()
        },
    );
    assert_eq!(only.dead_letters.len(), 1);
    assert_eq!(only.scanned, 4, "every dead letter read, one matched");
    let latest = list_dead_letters(
        &p,
        &dead_letters::Query {
            limit: 2,
            ..Default::default()
        },
    );
    assert_eq!(
        latest
            .dead_letters
            .iter()
            .map(|d| d.offset)
            .collect::<Vec<_>>(),
        [2, 3],
        "the latest two"
    );
    let later = list_dead_letters(
        &p,
        &dead_letters::Query {
            since_ms: Some(now_ms() + 60_000),
            ..Default::default()
        },
    );
    assert_eq!(
        (later.scanned, later.dead_letters.len(), later.complete),
        (0, 0, true)
    );

    // The listing's reader joined no group and committed nothing: its group id stays unknown.
    assert_eq!(
        testbed::kafka::group_state("streamapp-dead-letters-unused"),
        "Dead"
    );
    for (query, says) in [
        ("limit=0", "positive count"),
        ("who=me", "unknown query parameter"),
    ] {
        let (status, body) = p.get(&format!("{}?{query}", dead_letters::PATH)).unwrap();
        assert_eq!((status, body.contains(says)), (400, true), "{body}");
    }
}

/// Mean commit time (ms) over the commits between two readings of the histogram.
fn mean_commit_ms(before: (f64, f64), after: (f64, f64)) -> f64 {
    let (sum, count) = (after.0 - before.0, after.1 - before.1);
    if count > 0.0 {
        1000.0 * sum / count
    } else {
        0.0
    }
}

fn commit_histogram(p: &Processor) -> (f64, f64) {
    (
        p.metric("streamapp_processor_commit_seconds_sum")
            .unwrap_or(0.0),
        p.metric("streamapp_processor_commit_seconds_count")
            .unwrap_or(0.0),
    )
}

/// Lookups run on the HTTP server's threads against weak store handles: a burst of them (100
/// ids each, back to back) beside a load leaves the output exactly once. The commit latency
/// with and without the burst is printed, not asserted (a figure, not a timed test).
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_lookups_beside_a_load_leaves_the_output_exactly_once() {
    let _serial = serial().await;
    let app = App::with_partitions("lookup-burst", 2).await;
    let mut p = app.start("pod-0");
    p.wait_ready(MINUTE);
    let now = now_ms();
    // 100,000 records (75,000 ids) produced in 20 chunks, so the load spans many commits.
    let load = |from: usize| {
        let records: Vec<Input> = (0..100_000)
            .map(|i| Input::cmd(&format!("id-{}", from + i % 75_000), now))
            .collect();
        for chunk in records.chunks(5_000) {
            app.produce(chunk);
        }
    };
    let quiet = commit_histogram(&p);
    load(0);
    app.wait_until_processed(MINUTE);
    let loaded = commit_histogram(&p);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr_probe = {
        let stop = stop.clone();
        let ids: Vec<String> = (0..lookup::MAX_IDS).map(|i| format!("id-{i}")).collect();
        let path = format!("{}?{}", lookup::PATH, lookup::query(&ids));
        let port = p.port;
        std::thread::spawn(move || {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let mut served = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let answer = streamapp_api::probe::call(addr, "GET", &path, Duration::from_secs(5))
                    .expect("/lookup answers during the load");
                assert_eq!(answer.status, 200, "{}", answer.body);
                served += 1;
            }
            served
        })
    };
    load(1_000_000);
    app.wait_until_processed(MINUTE);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let served = addr_probe.join().expect("the lookups");
    let burst = commit_histogram(&p);
    println!(
        "mean commit: {:.1} ms without lookups ({} commits), {:.1} ms during {served} lookups of {} ids ({} commits)",
        mean_commit_ms(quiet, loaded),
        loaded.1 - quiet.1,
        mean_commit_ms(loaded, burst),
        lookup::MAX_IDS,
        burst.1 - loaded.1,
    );
    assert!(served > 0, "lookups were served during the load");
    let output = counts(&app.read(&app.output));
    assert_eq!(output.len(), 150_000, "every id of both loads once");
    assert!(output.values().all(|&n| n == 1), "each id once");
    assert_eq!(app.read(&app.duplicates).len(), 50_000);
}
