//! The dedup id read from a record's JSON value (`dedupId.source: JsonPointer`): the
//! processor's one-pass pointer walk (`streamapp_processor::json_pointer`) next to parsing the
//! whole document into a `serde_json::Value` and asking it, on records shaped like the
//! benchmarks' (`{"id":…,"seq":…,"sentUs":…,"payload":"xx…"}`, 200 bytes). No broker; prints
//! nanoseconds per record of each, in alternating rounds, and their ratio.
//!
//! `cargo bench -p streamapp-processor --bench json_id`

use std::hint::black_box;
use std::time::Instant;

use streamapp_processor::json_pointer::{self, Scalar};

const RECORDS: usize = 20_000;
const ROUNDS: usize = 7;
/// As the broker benchmarks send (`benches/common`).
const RECORD_BYTES: usize = 200;

fn records() -> Vec<Vec<u8>> {
    (0..RECORDS)
        .map(|n| {
            let head = format!(
                r#"{{"id":"cmd-{n:010}","seq":{n},"sentUs":{},"payload":""#,
                1_750_000_000_000_000i64 + n as i64
            );
            let pad = RECORD_BYTES.saturating_sub(head.len() + 2);
            format!("{head}{}\"}}", "x".repeat(pad)).into_bytes()
        })
        .collect()
}

fn walk(record: &[u8]) -> Vec<u8> {
    match json_pointer::find(record, "/id").unwrap() {
        Some(Scalar::String(s)) => s.into_bytes(),
        other => panic!("no id: {other:?}"),
    }
}

fn parse_whole(record: &[u8]) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(record).unwrap();
    match value.pointer("/id") {
        Some(serde_json::Value::String(s)) => s.as_bytes().to_vec(),
        other => panic!("no id: {other:?}"),
    }
}

/// Nanoseconds per record of `f` over every record.
fn time(records: &[Vec<u8>], f: fn(&[u8]) -> Vec<u8>) -> f64 {
    let start = Instant::now();
    for r in records {
        black_box(f(black_box(r)));
    }
    start.elapsed().as_nanos() as f64 / records.len() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let records = records();
    for r in &records[..100] {
        assert_eq!(walk(r), parse_whole(r), "both read the same id");
    }
    let (mut walked, mut parsed) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Alternating order, so neither always runs on a warmer cache.
        if round % 2 == 0 {
            walked.push(time(&records, walk));
            parsed.push(time(&records, parse_whole));
        } else {
            parsed.push(time(&records, parse_whole));
            walked.push(time(&records, walk));
        }
    }
    let spread = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("{lo:.0}–{hi:.0}")
    };
    let (w, p) = (median(walked.clone()), median(parsed.clone()));
    println!(
        "dedup id from a {RECORD_BYTES}-byte JSON value, {RECORDS} records x {ROUNDS} rounds (median, spread ns/record):"
    );
    println!(
        "  pointer walk (streamapp)   {w:>6.0} ns   ({})",
        spread(&walked)
    );
    println!(
        "  whole-document parse       {p:>6.0} ns   ({})",
        spread(&parsed)
    );
    println!("  parse / walk               {:>6.2}x", p / w);
}
