//! `kubectl streamapp status` of fixed statuses, plain and JSON, against the files in
//! tests/golden/. After an intended change of the output: `UPDATE_GOLDEN=1 cargo test -p
//! kubectl-streamapp --test plugin -- golden::`, and review the diff.

use crate::common;

use kubectl_streamapp::render::{self, Colour};

fn check(file: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(actual, expected, "{} differs", path.display());
}

#[test]
fn status_of_an_app_in_the_middle_of_a_restore() {
    let text = render::tree(&[common::app("orders", 6000)], common::now(), Colour::Never);
    check("status.txt", &text);
}

#[test]
fn status_as_json() {
    let json = serde_json::to_string_pretty(&render::data(&[common::app("orders", 6000)])).unwrap();
    check("status.json", &format!("{json}\n"));
}

#[test]
fn colour_only_when_asked() {
    let plain = render::tree(&[common::app("orders", 6000)], common::now(), Colour::Never);
    assert!(!plain.contains('\x1b'));
    let coloured = render::tree(&[common::app("orders", 6000)], common::now(), Colour::Ansi);
    assert!(
        coloured.starts_with("\x1b[1mprod/orders\x1b[0m  \x1b[33mProgressing\x1b[0m"),
        "{coloured}"
    );
    assert!(
        coloured.contains("\x1b[31mquarantines 1\x1b[0m"),
        "{coloured}"
    );
}

/// Two pods of `orders` asked about five ids; the second pod was restarting.
fn lookup_answers() -> (Vec<String>, Vec<kubectl_streamapp::lookup::PodAnswer>) {
    use streamapp_api::health::TaskState;
    use streamapp_api::lookup::{Answer, Found, HeldStore, IdAnswer, Source};
    let t = 1_764_950_400_123;
    let found = |partition, state, expired, source: bool| Found {
        partition,
        state: Some(state),
        first_seen: t,
        expires_at: t + 86_400_000,
        expired,
        source: source.then(|| Source {
            topic: "orders".into(),
            partition,
            offset: 1234,
        }),
    };
    let entry = |id: &str, partition, found: Vec<Found>| IdAnswer {
        id: id.into(),
        partition: Some(partition),
        found,
        asked: vec![partition],
    };
    let ids = ["cmd-1", "cmd-2", "cmd-3", "cmd-4", "cmd-5"]
        .map(String::from)
        .to_vec();
    let answer = Answer {
        pod: "orders-0".into(),
        retention_ms: 86_400_000,
        stores: vec![
            HeldStore {
                partition: 0,
                state: Some(TaskState::Active),
            },
            HeldStore {
                partition: 1,
                state: Some(TaskState::Standby),
            },
        ],
        ids: vec![
            entry("cmd-1", 0, vec![found(0, TaskState::Active, false, true)]),
            entry("cmd-2", 1, vec![found(1, TaskState::Standby, true, true)]),
            entry("cmd-3", 0, vec![]),
            entry("cmd-4", 1, vec![]),
            entry("cmd-5", 0, vec![found(0, TaskState::Active, false, false)]),
        ],
    };
    let answers = vec![
        ("orders-0".to_string(), Ok(answer)),
        (
            "orders-1".to_string(),
            Err("could not get pods/proxy/orders-1 in namespace prod: connection refused".into()),
        ),
    ];
    (ids, answers)
}

#[test]
fn lookup_as_a_table() {
    let (ids, answers) = lookup_answers();
    let rows = kubectl_streamapp::lookup::merge(&ids, &answers);
    check(
        "lookup.txt",
        &kubectl_streamapp::lookup::table(&rows, &answers),
    );
}

#[test]
fn lookup_as_json() {
    let (ids, answers) = lookup_answers();
    let rows = kubectl_streamapp::lookup::merge(&ids, &answers);
    let json = serde_json::to_string_pretty(&rows).unwrap();
    check("lookup.json", &format!("{json}\n"));
}

#[test]
fn dead_letters_as_a_table() {
    use streamapp_api::dead_letters::{DeadLetter, Listing};
    let t = 1_764_950_400_123;
    let listing = Listing {
        topic: "orders.dlq".into(),
        pod: "orders-0".into(),
        scanned: 12,
        complete: true,
        dead_letters: vec![
            DeadLetter {
                partition: 0,
                offset: 7,
                time: t,
                reason: Some("invalid-json".into()),
                source: Some("orders/2/1234".into()),
                error: Some(
                    "the value is not valid JSON: expected value at line 1 column 2".into(),
                ),
                size: 9,
                value_prefix: Some("{not json".into()),
            },
            DeadLetter {
                partition: 0,
                offset: 8,
                time: t + 1000,
                reason: Some("value-too-large".into()),
                source: Some("orders/0/99".into()),
                error: Some("the value is 2048 bytes, the limit is 1024".into()),
                size: 2048,
                value_prefix: None,
            },
        ],
    };
    check(
        "dead-letters.txt",
        &kubectl_streamapp::dead_letters::table(&listing),
    );
}
