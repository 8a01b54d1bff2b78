//! Benchmark: streamapp-processor next to Kafka Streams 4.4 running the same dedup topology
//! (bench/kafka-streams), at its defaults and at its best reasonable configuration, with the
//! topology's Kafka work alone (the skeleton) as the floor — one after the other, on the same
//! local broker, with the same input, measured in a steady state.
//!
//! Run it with `make bench-compare`, which installs what it needs (Kafka, the Java peer through
//! Maven, matplotlib for the chart), starts the broker if it is not running, runs this, and
//! draws the chart. This program needs `BENCH_KS_CLASSPATH` (the peer's classpath).
//!
//! The systems (all exactly-once, commit interval 100 ms, one processing thread, static group
//! membership as a StatefulSet pod has):
//! - `streamapp`: the real `streamapp-processor` binary, default RocksDB profile (its WAL
//!   written, not synced per commit), id from the JSON value (`dedupId.source: JsonPointer`),
//!   `topology.repartition: Auto`;
//! - `streamapp-walsync` and `streamapp-nowal` (throughput only): the same with an fsync of the
//!   WAL per applied commit (`rocksdb.wal.syncOnCommit`), and without a WAL
//!   (`rocksdb.wal.enabled: false`, what Kafka Streams runs RocksDB with): what each durability
//!   per commit costs;
//! - `skeleton`: the dedup topology's Kafka work alone — the same topics, consumes, produces,
//!   headers and transactions as `streamapp`, the id found in the JSON value the same way, an
//!   in-memory set instead of the store (`common/reference/skeleton.rs`): the floor of this
//!   topology on this broker; what `streamapp` spends beyond it is its store and its engine;
//! - `copy`: a plain transactional copy (consume → produce, the processor's client settings,
//!   no store): one consume and one produce per record, a reference row;
//! - `ks-defaults`: Kafka Streams as the topology is written, every setting at the library's
//!   default (its producer lingers 100 ms under EOS; a store builder's store is not cached), a
//!   persistent window store with a range fetch per record;
//! - `ks-window`: the same tuned as a competent user would: the producer's `linger.ms` the
//!   run's (see the sweep below) and `batch.size=1000000` (the processor's), the store cache as
//!   `BENCH_KS_CACHE_BYTES` says (default 0: off — an EOS commit every 100 ms flushes it
//!   anyway, and each id is written once, so there is nothing for it to merge);
//! - `ks-kv`: tuned like `ks-window`, with a key-value store and a point lookup per record
//!   instead, expired by a stream-time punctuation every half retention;
//! - `ks-window-txn` (recovery only): `ks-window` with KIP-892 transactional state stores.
//!
//! Ratios are against the best Kafka Streams configuration on each metric.
//!
//! The input (`BENCH_KEYING=unrelated`, the default) is JSON records of 200 B with the id
//! inside and record keys unrelated to the id, 30% repeats spread across the 4 partitions: every
//! system must re-key by the id before the dedup — streamapp through its repartition stage,
//! Kafka Streams through `selectKey` + `repartition()` (an internal repartition topic), both in
//! the same exactly-once transactions. `BENCH_KEYING=id` keys the records by the id instead and
//! leaves the repartition out on both sides (`repartition: Never`), to show what it costs.
//!
//! What one run does:
//! 1. Throughput, CPU per million records, peak RSS: `BENCH_RECORDS` (default 5,000,000) records
//!    whose record times span five retentions (`BENCH_RETENTION_SECONDS`, default 120, shortened
//!    from an hour so that expiry runs: each repeat falls within a quarter retention of its
//!    first occurrence; runs under 500,000 records span less, see `MAX_RECORDS_PER_RETENTION`). Each system consumes all of it in a process of its own; measured between
//!    40% and 90% of the input committed through every stage (the JVM has compiled the hot path,
//!    the stores have filled past their retention, so expiry is running). `BENCH_RUNS` (default
//!    3) runs, in alternating order (forwards, backwards, ...); the median and the spread
//!    (max − min, % of the median) are reported, and the machine's load next to every figure.
//!    Each run sweeps the producers' `linger.ms` over `BENCH_LINGERS` (default 5,20,50) for
//!    the systems the goals compare (`streamapp`, `skeleton`, `ks-window`, `ks-kv`); the
//!    reference rows (the WAL variants, the copy) run at its first value, `ks-defaults` at the
//!    library's own; each system is reported at its best (highest median throughput) and
//!    measured for latency at it.
//! 2. Correctness, before any figure is believed, after every run: the system's committed
//!    output holds every input id exactly once and nothing else, its duplicates topic every
//!    repeat (the copy: every input record once). A wrong output fails the run at once.
//! 3. Latency p50/p99 at `BENCH_LATENCY_PERCENT` (default 50) % of each system's own median
//!    throughput (`BENCH_LATENCY_RATE` sets one rate for all instead), each on fresh topics, the
//!    same runs and order: a warm-up of `BENCH_LATENCY_WARMUP_SECONDS` (default 30) after which
//!    everything sent more than 1 s earlier must be committed through every stage (no backlog)
//!    — otherwise the warm-up is extended, at most 3 times, and then the run fails — and a
//!    window of `BENCH_LATENCY_SECONDS` (default 20). Its output is checked exactly once too.
//!    The phase begins with one such run of its first system that is not counted: it warms the
//!    broker, on which a first run found no steady state when the broker had just started.
//! 4. Recovery after kill -9, for each key count in `BENCH_RECOVERY_KEYS` (default
//!    20000,1000000,5000000), `BENCH_RUNS` runs in alternating order: each system loads that
//!    many distinct ids (the time it takes is reported too); live traffic (1,000 records/s of
//!    new ids) runs for 3 s so that the kill lands mid-transaction; kill -9; 1,000 new records
//!    are sent; the system is restarted on the same state directory. Measured: time from the
//!    restart to the first new committed output record, to catching up with the input, and the
//!    records it restored from its changelog. Then its output is checked again: every id
//!    exactly once across the crash. Then `streamapp` and `ks-window` are stopped, their state
//!    directory deleted, and started again: the rate of that full restore from the changelog
//!    (records/s between the first restore start and the last end, as each system reports
//!    them), and the time until every task is restored (see `restore.rs`).
//! 5. Failover, for each key count in `BENCH_FAILOVER_KEYS` (default 1000000), with one
//!    standby copy of each task and with none, `BENCH_RUNS` runs in alternating order: each
//!    system runs as two instances (`streamapp` with `group.standbyReplicas`, Kafka Streams
//!    `ks-window` with `num.standby.replicas`; both with a 6 s group session timeout), loads
//!    that many ids, waits until every standby copy is caught up (each system's own report: the
//!    processor's `standby_lag` metric, the peer's store lags), then one instance is killed
//!    (-9) under live traffic and stays down. Measured: from the kill until the survivor has
//!    committed every record sent, and the changelog records the survivor restored to take the
//!    lost tasks over. Both figures include the session timeout and, on both sides, the wait
//!    for the dead instance's open transaction to time out (`transaction.timeout.ms` 10 s on
//!    both; until then no read_committed reader gets past it in the repartition topic). Output
//!    checked exactly once across the failover.
//! 6. Scaling out and up (streamapp only): `BENCH_SCALING_RECORDS` (default half of
//!    `BENCH_RECORDS`) records on an input of 8 partitions, consumed by 1, 2 and 4 processes of
//!    one group in turn (`BENCH_SCALING_PROCESSES`; under `BENCH_PIN=1` on every CPU, not on
//!    the systems' one), each process one processing thread, and by
//!    one process with 2 processing threads (`BENCH_SCALING_THREADS`; empty for none),
//!    `BENCH_RUNS` runs in alternating order; measured like phase 1 with the CPU and memory of all processes added
//!    up, and how busy the whole machine was (where throughput stops growing, that says whether
//!    the machine was the limit). The records' times are the load's and the retention the full
//!    hour, so nothing expires (spread over retentions, one process running ahead of another in
//!    record time would expire first sightings, as the window means it to). Output checked
//!    exactly once after each.
//! 7. A table with the medians, spreads and ratios, the goals met or not, and a CSV
//!    (`BENCH_CSV`, default bench/results/vs-kafka-streams.csv) from which
//!    bench/compare/chart.py draws the PNG.
//!
//! `BENCH_PHASES` (e.g. `recovery`) runs only some of phases 1–6 (`throughput`, `latency`,
//! `recovery`, `failover`, `scaling`; the table shows – for what was not run), `BENCH_PEERS` (e.g.
//! `streamapp,ks-window`) only some systems. `BENCH_THREADS` (default 1) runs each system with
//! that many processing threads in the throughput, latency and recovery phases (the processor's
//! `processingThreads`, Kafka Streams' `num.stream.threads`; the skeleton and the copy have
//! one); failover and scaling keep one per process.
//!
//! A full run takes longer than one sitting may allow, so it can be run in two halves on the
//! same build: `BENCH_PHASES=throughput` first, then the other phases with
//! `BENCH_THROUGHPUT_FROM` naming the first half's CSV: the latency phase then loads each
//! system at its share of that CSV's median throughput, at that CSV's best `linger.ms`.
//!
//! `BENCH_SYSTEM_CPU` pins every system under test to that CPU (`taskset`); `make bench-compare`
//! with `BENCH_PIN=1` sets it to the last CPU and puts the broker and this driver on the others.
//!
//! Other knobs: `BENCH_JAVA`, `BENCH_JAVA_OPTS` (default `-Xmx1g`), `BENCH_KEEP_WORK` (keep logs
//! and state directories), `BENCH_PROCESSOR_LOG`, `BENCH_SYSTEM_PROPS` and `BENCH_ROCKSDB`
//! (see common/).
//! The exit code is non-zero when an output was not exactly once or a latency run found no
//! steady state.

#[path = "../common/mod.rs"]
mod common;
mod failover;
mod latency;
mod recovery;
mod report;
mod restore;
mod scaling;
mod settings;
mod steady;
mod sweep;
mod systems;

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use common::*;
use failover::{Failover, fail_over};
use recovery::{Recovery, recover};
use report::{Better, Row, Table, format_keys};
use restore::full_restore;
use scaling::ScalingRun;
use settings::Settings;
use steady::{Latency, Throughput};
use systems::{App, Peer};
use testbed::kafka;

/// Record time advances by at most a retention per this many input records (see `bench`).
const MAX_RECORDS_PER_RETENTION: f64 = 100_000.0;

fn main() -> ExitCode {
    if let Some((reference, args)) = reference::child() {
        reference::run_child(reference, &args);
        return ExitCode::SUCCESS;
    }
    let settings = Settings::from_env();
    run(|_, topics| bench(&settings, topics))
}

/// Every run's figures, per system.
#[derive(Default)]
struct Measured {
    /// Each system's throughput runs at its best `linger.ms` (see [`sweep::best_lingers`]).
    throughput: Vec<(Peer, Throughput)>,
    /// Every throughput run: each system at each `linger.ms` of the sweep.
    sweep: Vec<(Peer, u32, Throughput)>,
    /// Each system's best `linger.ms`: its highest median throughput.
    best_linger: Vec<(Peer, u32)>,
    latency: Vec<(Peer, Latency)>,
    recoveries: Vec<(u64, Vec<(Peer, Recovery)>)>,
    failovers: Vec<FailoverRuns>,
    scaling: Vec<ScalingRun>,
}

/// The failover runs of one key count and number of standby copies.
struct FailoverRuns {
    keys: u64,
    standby_replicas: u32,
    runs: Vec<(Peer, Failover)>,
}

/// The whole run. Returns whether every output was correct and every latency run steady.
fn bench(settings: &Settings, topics: &mut Topics<'_>) -> bool {
    println!(
        "streamapp-processor vs Kafka Streams 4.4: {} records, {} runs, keys {:?} ({}), {PARTITIONS} partitions, {} processing thread(s), commit interval {COMMIT_INTERVAL:?}, retention {:?}, broker {}",
        settings.records,
        settings.runs,
        settings.keying,
        if settings.repartitions() {
            "re-keyed by the id through a repartition topic"
        } else {
            "keyed by the id, no repartition"
        },
        settings.threads,
        settings.retention,
        kafka::bootstrap()
    );
    println!(
        "machine: {} cores; load average at start: {}; JVM options: {}; {}",
        cores(),
        loadavg(),
        settings.java_opts.join(" "),
        match system_cpu() {
            Some(cpu) => format!(
                "pinned: each system on CPU {cpu}, the broker and this driver on the others"
            ),
            None => "not pinned: systems, broker and driver share every core".into(),
        }
    );
    for p in Peer::ALL {
        println!("  {:<14} {}", p.name(), p.describe());
    }
    // Kept when the run fails (logs and state directories to look at) or BENCH_KEEP_WORK is
    // set; removed when it passes.
    let mut work = tempfile::Builder::new()
        .prefix("streamapp-bench-compare-")
        .tempdir()
        .expect("temp dir");
    work.disable_cleanup(true);
    println!("work dir (logs, state): {}", work.path().display());
    let run = testbed::unique_name("cmp");
    let mut measured = Measured::default();

    // ---- throughput, each run checked exactly once -------------------------------------------
    if settings.runs("throughput") {
        let input = format!("{run}-in");
        topics.create(&[&input]);
        let started = Instant::now();
        // Five retentions of record time, but at most a 100,000th of a retention per record: the
        // repartition stage interleaves the input partitions' records, one partition ahead of
        // another by thousands of records, and that disorder must stay well under the retention,
        // or a store's stream time runs so far ahead that a repeat's first sighting has expired
        // (in either system: a record older than stream time minus the retention counts as
        // expired). Runs under 500,000 records therefore cover less than five retentions.
        let span = (settings.retention * 5).min(
            settings
                .retention
                .mul_f64(settings.records as f64 / MAX_RECORDS_PER_RETENTION),
        );
        // Repeats within a quarter retention of record time: 70% of the records are new ids.
        let recent =
            (settings.records as f64 * settings.retention.as_secs_f64() / 4.0 / span.as_secs_f64()
                * 0.7) as u64;
        let workload = Workload::new().keyed(settings.keying).recent(recent);
        let dataset = produce_dataset(
            &input,
            settings.records,
            workload,
            RecordTime::Spread { span },
        );
        describe_dataset(&dataset, started.elapsed().as_secs_f64());
        println!(
            "throughput: record times span {span:?} ({:.1} retentions); measured from {:.0}% of the input committed through every stage, over at least {:.0}% more, to where both stages have done as many records since (within {:.0}% of the input), or over the whole run when no such point comes",
            span.as_secs_f64() / settings.retention.as_secs_f64(),
            100.0 * steady::WINDOW_START,
            100.0 * steady::WINDOW_MIN_SPAN,
            100.0 * steady::WINDOW_BALANCE
        );
        for r in 0..settings.runs {
            for (l, &linger_ms) in settings.lingers.iter().enumerate() {
                println!(
                    "throughput run {}/{}, linger.ms {linger_ms}:",
                    r + 1,
                    settings.runs
                );
                // The reference rows and Kafka Streams at its defaults: once a run.
                let peers = settings.order(Peer::MEASURED, r);
                for peer in peers.into_iter().filter(|p| l == 0 || p.swept()) {
                    let id = format!("{run}-t{r}-{linger_ms}-{}", peer.name());
                    let options = AppOptions {
                        linger_ms,
                        ..settings.options(settings.retention)
                    };
                    let app = App::create(topics, work.path(), peer, &id, &input, &options);
                    let mut system = app.start(settings);
                    let fig = steady::measure_throughput(&mut system, settings.records);
                    if peer.is_streamapp() {
                        print_processor_metrics(&system);
                    }
                    system.stop();
                    if !app.check(&format!("  {}", peer.name()), &dataset).correct {
                        println!(
                            "AN OUTPUT WAS NOT EXACTLY ONCE: no figure of this run means anything; stopping here (work dir kept)"
                        );
                        return false;
                    }
                    app.remove(topics);
                    measured.sweep.push((peer, linger_ms, fig));
                }
            }
        }
        topics.delete_all();
        measured.best_linger = sweep::best_lingers(&measured.sweep);
        measured.throughput = measured
            .sweep
            .iter()
            .filter(|(p, l, _)| measured.best_linger.contains(&(*p, *l)))
            .map(|(p, _, t)| (*p, *t))
            .collect();
        if settings.lingers.len() > 1 {
            sweep::print_linger_sweep(&measured.sweep, &measured.best_linger);
        }
    }
    // Latency is measured with each system at its best linger.ms (the default without a sweep),
    // at a share of its median throughput: this run's, or an earlier run's when this one does
    // not measure throughput and BENCH_THROUGHPUT_FROM names that run's CSV.
    let best = match &settings.throughput_from {
        Some(csv) if !settings.runs("throughput") => {
            let best = sweep::Best::from_csv(csv)
                .unwrap_or_else(|e| panic!("BENCH_THROUGHPUT_FROM={}: {e}", csv.display()));
            println!(
                "latency loads and lingers from the throughput phase of an earlier run: {}",
                csv.display()
            );
            best
        }
        _ => sweep::Best::measured(&measured.sweep, &measured.best_linger),
    };

    // ---- latency at the same fraction of each system's own maximum -------------------------
    let steady_state = match latency::phase(topics, work.path(), settings, &best, &run) {
        Some(phase) => {
            measured.latency = phase.figures;
            phase.steady_state
        }
        None => return false,
    };

    // ---- recovery after kill -9 --------------------------------------------------------------
    // What was wrong, each with its check and the system's warnings: repeated at the end.
    let mut wrong: Vec<String> = Vec::new();
    for &keys in settings
        .recovery_keys
        .iter()
        .filter(|_| settings.runs("recovery"))
    {
        let mut row = Vec::new();
        for r in 0..settings.runs {
            println!(
                "recovery after kill -9 with {keys} keys in the store, run {}/{}:",
                r + 1,
                settings.runs
            );
            for peer in settings.order(Peer::RECOVERED, r) {
                let id = format!("{run}-rec{keys}-{r}-{}", peer.name());
                // The full hour: nothing expires while the ids load.
                let options = settings.options(RETENTION);
                let (app, loaded) = loaded_app(
                    topics,
                    work.path(),
                    peer,
                    &id,
                    keys,
                    settings.keying,
                    &options,
                );
                let (mut recovery, check) = recover(settings, &app, &loaded, settings.keying);
                if check.correct && Peer::RESTORED.contains(&peer) {
                    recovery.full_restore = Some(full_restore(settings, &app, loaded.records));
                }
                if !check.correct {
                    wrong.push(format!(
                        "recovery with {keys} keys, run {}, {}:\n{}",
                        r + 1,
                        peer.name(),
                        check.line
                    ));
                }
                row.push((peer, recovery));
                remove_unless_wrong(topics, &app, check.correct);
            }
        }
        measured.recoveries.push((keys, row));
    }

    // ---- failover to a standby, and without one ----------------------------------------------
    for &keys in settings
        .failover_keys
        .iter()
        .filter(|_| settings.runs("failover"))
    {
        for standby_replicas in [1, 0] {
            let mut row = Vec::new();
            for r in 0..settings.runs {
                println!(
                    "failover with {keys} keys in the store, {}, run {}/{}:",
                    failover::describe(standby_replicas),
                    r + 1,
                    settings.runs
                );
                for peer in settings.order(Peer::FAILED_OVER, r) {
                    let id = format!("{run}-fo{keys}-{standby_replicas}-{r}-{}", peer.name());
                    let options = AppOptions {
                        standby_replicas,
                        session_timeout: Some(failover::SESSION_TIMEOUT),
                        // Standbys need the processor's one member per pod.
                        processing_threads: 1,
                        ..settings.options(RETENTION)
                    };
                    let (app, loaded) = loaded_app(
                        topics,
                        work.path(),
                        peer,
                        &id,
                        keys,
                        settings.keying,
                        &options,
                    );
                    let (figures, check) =
                        fail_over(settings, &app, standby_replicas, &loaded, settings.keying);
                    if !check.correct {
                        wrong.push(format!(
                            "failover with {keys} keys, {}, run {}, {}:\n{}",
                            failover::describe(standby_replicas),
                            r + 1,
                            peer.name(),
                            check.line
                        ));
                    }
                    row.push((peer, figures));
                    remove_unless_wrong(topics, &app, check.correct);
                }
            }
            measured.failovers.push(FailoverRuns {
                keys,
                standby_replicas,
                runs: row,
            });
        }
    }

    // ---- scaling out: 1, 2, 4 processes on 8 partitions ------------------------------------
    if settings.runs("scaling") && settings.peers.contains(&Peer::Streamapp) {
        // Pinned to one CPU, more processes would only share it: here they get the machine.
        if system_cpu().is_some() {
            unpin_systems();
            println!(
                "scaling: the processes run on every CPU (the broker stays on its own), not pinned"
            );
        }
        let input = format!("{run}-scale-in");
        topics.create_with(&[&input], scaling::PARTITIONS);
        let started = Instant::now();
        // Record times of the load, and the full hour of retention: nothing expires. (Spread
        // over several retentions as in the throughput phase, a process that routes faster
        // than another runs its records ahead in record time, and a first sighting can expire
        // before its repeat, routed by the slower one, arrives — as the window means it to.)
        let dataset = produce_dataset(
            &input,
            settings.scaling_records,
            Workload::new().keyed(settings.keying),
            RecordTime::Now,
        );
        describe_dataset(&dataset, started.elapsed().as_secs_f64());
        for r in 0..settings.runs {
            let mut order = settings.scaling_shapes.clone();
            if r % 2 == 1 {
                order.reverse();
            }
            println!(
                "scaling run {}/{}: streamapp as {} on {} partitions",
                r + 1,
                settings.runs,
                order
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", then "),
                scaling::PARTITIONS
            );
            for shape in order {
                let id = format!("{run}-s{r}-{}p{}t", shape.processes, shape.threads);
                let (figures, check) = scaling::run_processes(
                    settings,
                    topics,
                    work.path(),
                    &id,
                    &input,
                    &dataset,
                    shape,
                );
                if !check.correct {
                    println!(
                        "AN OUTPUT WAS NOT EXACTLY ONCE: no figure of this run means anything; stopping here (work dir kept)"
                    );
                    return false;
                }
                measured.scaling.push(figures);
            }
        }
        topics.delete(&[input]);
    }

    let table = table(&measured, settings);
    table.print(settings.latency_percent);
    table.write_csv(&settings.csv);
    println!("CSV: {}", settings.csv.display());
    println!("load average at end: {}", loadavg());
    for what in &wrong {
        println!("NOT EXACTLY ONCE: {what}");
    }
    if !wrong.is_empty() {
        println!(
            "AN OUTPUT WAS NOT EXACTLY ONCE AFTER A CRASH OR FAILOVER: {} run(s), listed above (work dir {} kept)",
            wrong.len(),
            work.path().display()
        );
    }
    if !steady_state {
        println!("A LATENCY RUN FOUND NO STEADY STATE: see above");
    }
    let passed = wrong.is_empty() && steady_state;
    if passed && std::env::var_os("BENCH_KEEP_WORK").is_none() {
        let _ = std::fs::remove_dir_all(work.path());
    }
    passed
}

/// A new application `id` of `peer` on an input of its own holding `keys` distinct ids (the
/// same records each time: the live traffic and the records sent during one system's crash must
/// not reach the next system), keyed by `keying`.
fn loaded_app(
    topics: &mut Topics<'_>,
    work: &Path,
    peer: Peer,
    id: &str,
    keys: u64,
    keying: Keying,
    options: &AppOptions,
) -> (App, Dataset) {
    let input = format!("{id}-in");
    topics.create(&[&input]);
    let loaded = produce_dataset(
        &input,
        keys,
        Workload::with(0.0, "key").keyed(keying),
        RecordTime::Now,
    );
    (App::create(topics, work, peer, id, &input, options), loaded)
}

/// Deletes an application's topics, its input and its state, unless its output was wrong: then
/// they are kept to look into.
fn remove_unless_wrong(topics: &mut Topics<'_>, app: &App, ok: bool) {
    if ok {
        app.remove(topics);
        topics.delete(std::slice::from_ref(&app.input));
    }
}

fn table(m: &Measured, settings: &Settings) -> Table {
    let throughput = |f: fn(&Throughput) -> f64| per_peer(&m.throughput, f);
    let latency = |f: fn(&Latency) -> f64| per_peer(&m.latency, f);
    let pct = settings.latency_percent;
    let mut rows = vec![
        Row::new(
            sweep::THROUGHPUT_ROW,
            "records/s",
            Better::Higher,
            throughput(|t| t.records_per_s),
        ),
        Row::new(
            "CPU per 1M records",
            "CPU s",
            Better::Lower,
            throughput(|t| t.cpu_s_per_million),
        ),
        Row::new(
            "CPU per 1M records, rest of the machine (broker, driver)",
            "CPU s",
            Better::Lower,
            throughput(|t| t.others_cpu_s_per_million),
        ),
        Row::new(
            "throughput per core",
            "records/CPU s",
            Better::Higher,
            throughput(|t| 1e6 / t.cpu_s_per_million),
        ),
        Row::new(sweep::BEST_LINGER_ROW, "ms", Better::Neither, |peer| {
            m.best_linger
                .iter()
                .filter(|(p, _)| *p == peer && p.takes_linger())
                .map(|(_, l)| f64::from(*l))
                .collect()
        }),
        Row::new(
            "peak RSS",
            "MiB",
            Better::Lower,
            throughput(|t| t.peak_rss_mib),
        ),
        Row::new(
            "machine busy in the throughput window",
            "cores",
            Better::Neither,
            throughput(|t| t.machine_busy_cores),
        ),
        Row::new(
            format!("latency p50 at {pct}% of own max"),
            "ms",
            Better::Lower,
            latency(|l| l.p50_ms),
        ),
        Row::new(
            format!("latency p99 at {pct}% of own max"),
            "ms",
            Better::Lower,
            latency(|l| l.p99_ms),
        ),
        Row::new(
            "latency measured at",
            "records/s",
            Better::Neither,
            latency(|l| l.rate as f64),
        ),
        Row::new(
            "machine busy in the latency window",
            "cores",
            Better::Neither,
            latency(|l| l.machine_busy_cores),
        ),
    ];
    for (keys, runs) in &m.recoveries {
        let keys = format_keys(*keys);
        let recovery = |f: fn(&Recovery) -> f64| per_peer(runs, f);
        rows.push(Row::new(
            format!("recovery {keys} keys: load"),
            "s",
            Better::Lower,
            recovery(|r| r.load_s),
        ));
        rows.push(Row::new(
            format!("recovery {keys} keys: first output"),
            "s",
            Better::Lower,
            recovery(|r| r.first_output_s),
        ));
        rows.push(Row::new(
            format!("recovery {keys} keys: caught up"),
            "s",
            Better::Lower,
            recovery(|r| r.caught_up_s),
        ));
        rows.push(Row::new(
            format!("recovery {keys} keys: records restored"),
            "records",
            Better::Lower,
            recovery(|r| r.restored as f64),
        ));
        // A system without a full restore has no figure: NaN is left out of its row.
        rows.push(Row::new(
            format!("recovery {keys} keys: full restore rate"),
            "records/s",
            Better::Higher,
            recovery(|r| r.full_restore.map_or(f64::NAN, |f| f.records_per_s())),
        ));
        rows.push(Row::new(
            format!("recovery {keys} keys: full restore in service"),
            "s",
            Better::Lower,
            recovery(|r| r.full_restore.map_or(f64::NAN, |f| f.in_service_s)),
        ));
        rows.push(Row::new(
            format!("recovery {keys} keys: full restore settled"),
            "s",
            Better::Lower,
            recovery(|r| r.full_restore.map_or(f64::NAN, |f| f.settled_s)),
        ));
        rows.push(Row::new(
            format!("recovery {keys} keys: CPU after the restore"),
            "CPU s",
            Better::Lower,
            recovery(|r| r.full_restore.map_or(f64::NAN, |f| f.cpu_after_s)),
        ));
    }
    for FailoverRuns {
        keys,
        standby_replicas,
        runs,
    } in &m.failovers
    {
        // No comma: the label is a CSV field too.
        let label = format!(
            "failover {} keys with {}",
            format_keys(*keys),
            failover::describe(*standby_replicas)
        );
        let failover = |f: fn(&Failover) -> f64| per_peer(runs, f);
        rows.push(Row::new(
            format!("{label}: caught up"),
            "s",
            Better::Lower,
            failover(|f| f.caught_up_s),
        ));
        rows.push(Row::new(
            format!("{label}: restored"),
            "records",
            Better::Lower,
            failover(|f| f.restored as f64),
        ));
    }
    for &shape in &settings.scaling_shapes {
        let runs: Vec<(Peer, Throughput)> = m
            .scaling
            .iter()
            .filter(|s| s.shape == shape)
            .map(|s| (Peer::Streamapp, s.figures))
            .collect();
        let scaled = |f: fn(&Throughput) -> f64| per_peer(&runs, f);
        let label = shape.label();
        rows.push(Row::new(
            format!("{label}: throughput"),
            "records/s",
            Better::Higher,
            scaled(|t| t.records_per_s),
        ));
        rows.push(Row::new(
            format!("{label}: machine busy"),
            "cores",
            Better::Neither,
            scaled(|t| t.machine_busy_cores),
        ));
    }
    Table { rows }
}

/// A row's figures: per system, `f` of each of its runs.
fn per_peer<T>(runs: &[(Peer, T)], f: fn(&T) -> f64) -> impl Fn(Peer) -> Vec<f64> + '_ {
    move |peer| {
        runs.iter()
            .filter(|(p, _)| *p == peer)
            .map(|(_, run)| f(run))
            .collect()
    }
}
