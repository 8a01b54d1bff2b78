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
