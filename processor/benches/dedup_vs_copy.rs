//! Benchmark: the EOS dedup topology (the real `streamapp-processor` binary) next to a plain
//! transactional copy (consume → produce, same commit interval, no store), measured in the same
//! run on the local broker. It prints figures and the ratios dedup/copy; it asserts nothing
//! about speed (a ratio against a peer measured on the same machine at the same time means
//! something on a busy 2-core box; an absolute threshold does not).
//!
//! Run it with `make bench` (the broker must be up: `make up`), or
//! `CARGO_TARGET_DIR=~/.cache/streamapp/target cargo bench -p streamapp-processor --bench dedup_vs_copy`.
//! Smaller runs: `BENCH_RECORDS`, `BENCH_LATENCY_RATE`, `BENCH_LATENCY_SECONDS`.
//!
//! What one run does:
//! 1. Produces the input once: `BENCH_RECORDS` (default 1,000,000) JSON records of 200 B, 4
//!    partitions, about 30% repeating an earlier id (key = id, so repeats share a partition).
//! 2. Throughput: the processor (one process, commit interval 100 ms) consumes all of it; then
//!    the copy consumes the same topic under its own consumer group. Each runs in a process of
//!    its own so that RSS and CPU are its own: the copy is this program re-executed with
//!    `copy`. Progress is watched the same way for both, through the group's committed offsets.
//! 3. Correctness of the dedup output: each id exactly once.
//! 4. Latency at a fixed load well below both maximums (`BENCH_LATENCY_RATE` records/s, default
//!    2,000 — a quarter of the processor's throughput on the 2-core dev machine — for `BENCH_LATENCY_SECONDS`, default 20, after a 3 s warm-up, the same 30%
//!    repeats), each system on fresh topics: receive time of the output record under
//!    read_committed − send time of the input record.
//! 5. A table and the ratios dedup/copy; the load average at start and end. The topics are
//!    deleted at the end (a run writes about 1 GB to the broker).

mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::reference::copy::start_copy;
use common::reference::stop_and_report;
use common::*;
use testbed::kafka::{self, Isolation};

fn main() -> ExitCode {
    if let Some((reference, args)) = reference::child() {
        reference::run_child(reference, &args);
        return ExitCode::SUCCESS;
    }
    let settings = Settings::from_env();
    run(|_, topics| bench(&settings, topics))
}

struct Settings {
    records: u64,
    latency_rate: u64,
    latency_duration: Duration,
}

impl Settings {
    fn from_env() -> Self {
        Settings {
            records: env_num("BENCH_RECORDS", 1_000_000),
            latency_rate: env_num("BENCH_LATENCY_RATE", 2_000),
            latency_duration: Duration::from_secs(env_num("BENCH_LATENCY_SECONDS", 20)),
        }
    }
}

/// The whole run. Returns whether the dedup output was correct.
fn bench(settings: &Settings, topics: &mut Topics<'_>) -> bool {
    println!(
        "dedup vs transactional copy: {} records, {PARTITIONS} partitions, commit interval {COMMIT_INTERVAL:?}, broker {}",
        settings.records,
        kafka::bootstrap()
    );
    println!(
        "machine: {} cores; load average at start: {}",
        cores(),
        loadavg()
    );
    let work = tempfile::Builder::new()
        .prefix("streamapp-bench-")
        .tempdir()
        .expect("temp dir");
    let run = testbed::unique_name("bench");

    // ---- the input, produced once for both systems ---------------------------------------
    let input = format!("{run}-in");
    topics.create(&[&input]);
    let started = Instant::now();
    let dataset = produce_dataset(&input, settings.records, Workload::new(), RecordTime::Now);
    describe_dataset(&dataset, started.elapsed().as_secs_f64());

    // ---- throughput: one system after the other, on the same input ------------------------
    let dedup_app = DedupApp::create(
        topics,
        work.path(),
        &format!("{run}-dedup"),
        &input,
        &AppOptions::keyed_by_id(),
    );
    let mut dedup = dedup_app.start();
    let mut dedup_fig = measure_throughput(&mut dedup, settings.records);
    print_processor_metrics(&dedup);
    dedup.stop();

    let copy_output = format!("{run}-copy-out");
    topics.create(&[&copy_output]);
    let mut copy = start_copy(
        work.path(),
        &format!("{run}-copy"),
        &input,
        &copy_output,
        LINGER_MS,
    );
    let mut copy_fig = measure_throughput(&mut copy, settings.records);
    stop_and_report(copy);

    // ---- correctness of what was measured --------------------------------------------------
    let correct =
        check_dedup_output("dedup", &dedup_app.output, &dedup_app.duplicates, &dataset).correct;
    let copied = kafka::read_all(&copy_output, Isolation::ReadCommitted, |_| {});
    println!(
        "copy output: {copied} records (expected {})",
        dataset.records
    );

    // ---- latency at a fixed load, fresh topics per system -----------------------------------
    println!(
        "latency: {} records/s for {:?} after a {LATENCY_WARMUP:?} warm-up (30% repeats), per system on fresh topics",
        settings.latency_rate, settings.latency_duration
    );
    let lat_input = format!("{run}-lat-dedup-in");
    topics.create(&[&lat_input]);
    let lat_app = DedupApp::create(
        topics,
        work.path(),
        &format!("{run}-lat-dedup"),
        &lat_input,
        &AppOptions::keyed_by_id(),
    );
    let mut lat_dedup = lat_app.start();
    lat_dedup.wait_ready();
    measure_latency(
        &mut dedup_fig,
        &lat_dedup,
        &lat_app.output,
        settings.latency_rate,
        settings.latency_duration,
        true,
    );
    print_processor_metrics(&lat_dedup);
    lat_dedup.stop();

    let (lat_input, lat_output) = (format!("{run}-lat-copy-in"), format!("{run}-lat-copy-out"));
    topics.create(&[&lat_input, &lat_output]);
    let mut lat_copy = start_copy(
        work.path(),
        &format!("{run}-lat-copy"),
        &lat_input,
        &lat_output,
        LINGER_MS,
    );
    lat_copy.wait_ready();
    measure_latency(
        &mut copy_fig,
        &lat_copy,
        &lat_output,
        settings.latency_rate,
        settings.latency_duration,
        false,
    );
    stop_and_report(lat_copy);

    print_table(&dedup_fig, &copy_fig);
    println!("load average at end: {}", loadavg());
    if !correct {
        println!(
            "THE DEDUP OUTPUT WAS NOT CORRECT: the figures above do not describe a working processor"
        );
    }
    correct
}

fn print_table(dedup: &Figures, copy: &Figures) {
    println!();
    println!(
        "{:<12} {:>10} {:>11} {:>8} {:>8} {:>13}",
        "system", "records/s", "CPU s / 1M", "p50 ms", "p99 ms", "peak RSS MiB"
    );
    for (name, f) in [("dedup", dedup), ("copy", copy)] {
        println!(
            "{name:<12} {:>10.0} {:>11.1} {:>8.1} {:>8.1} {:>13.0}",
            f.records_per_s, f.cpu_s_per_million, f.p50_ms, f.p99_ms, f.peak_rss_mib
        );
    }
    println!(
        "{:<12} {:>10.2} {:>11.2} {:>8.2} {:>8.2} {:>13.2}",
        "dedup/copy",
        dedup.records_per_s / copy.records_per_s,
        dedup.cpu_s_per_million / copy.cpu_s_per_million,
        dedup.p50_ms / copy.p50_ms,
        dedup.p99_ms / copy.p99_ms,
        dedup.peak_rss_mib / copy.peak_rss_mib
    );
    println!();
}
