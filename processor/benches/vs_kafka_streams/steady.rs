//! Measurements in a steady state: throughput in a window of the run after a warm-up (the JVM
//! compiled, the stores past their retention, so expiry runs), and latency at a fixed load
//! after a warm-up that must leave no backlog.

use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer};
use testbed::kafka;

use crate::common::*;

/// Where the throughput window may start (the share of the input through every stage before
/// it: the JVM has compiled its hot path, the stores have filled past their retention), and the
/// least share of the input it must span.
pub const WINDOW_START: f64 = 0.4;
pub const WINDOW_MIN_SPAN: f64 = 0.25;
/// How far apart (a share of the input) the two stages' progress in the window may be.
pub const WINDOW_BALANCE: f64 = 0.01;
/// Latency: everything sent more than this long ago must have been committed through every
/// stage when the window starts, or the system still has a backlog (10 commit intervals).
pub const BACKLOG_GRACE: Duration = Duration::from_secs(1);
/// Latency: how many times a warm-up that left a backlog is extended before the run fails.
pub const MAX_REWARMS: u32 = 3;

/// What the machine did meanwhile: CPU time of all processes, from /proc/stat.
#[derive(Clone, Copy)]
pub struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.parse().ok())
            .collect();
        let total = ticks.iter().take(8).sum();
        // idle and iowait
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        MachineCpu {
            busy: total - idle,
            total,
        }
    }

    /// Cores busy on average since `earlier` (all processes: the system measured, the broker,
    /// this driver, anything else).
    pub fn busy_cores_since(&self, earlier: &MachineCpu) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return f64::NAN;
        }
        self.busy.saturating_sub(earlier.busy) as f64 / total as f64 * cores() as f64
    }
}

/// One throughput run of one system.
#[derive(Clone, Copy)]
pub struct Throughput {
    pub records_per_s: f64,
    pub cpu_s_per_million: f64,
    pub peak_rss_mib: f64,
    /// Cores the whole machine kept busy during the window.
    pub machine_busy_cores: f64,
    /// CPU the rest of the machine (the broker, mostly; this driver) spent per 1M records of
    /// the window: machine busy minus the system's own. The broker's share is a cost of the
    /// system too: more produces or fetches per record are more broker work.
    pub others_cpu_s_per_million: f64,
}

/// A point of a run: when, how far, and the CPU used so far.
struct Mark {
    at: Instant,
    /// Records through every stage.
    done: u64,
    /// Records through the first stage (the input's committed offsets): ahead of `done` by
    /// the repartition topic's backlog.
    routed: u64,
    cpu_s: f64,
    machine: MachineCpu,
}

/// How far a system's first stage is ahead of its last, in records.
fn lead(routed: u64, done: u64) -> i64 {
    routed as i64 - done as i64
}

/// What a throughput window is, seen from its start: `(routed, done)` at the start and now.
#[derive(Debug, PartialEq, Eq)]
enum WindowEnd {
    /// Not yet.
    Open,
    /// Here: both stages moved the same number of records since the start (within
    /// [`WINDOW_BALANCE`]), over at least [`WINDOW_MIN_SPAN`] of the input.
    Balanced,
    /// Never: the first stage has consumed the whole input and its lead over the last stage
    /// is already below what it was at the start, or the last stage has (all but) caught up,
    /// so no later point balances them. The whole run is measured instead (from ready to
    /// everything committed: both stages did every record).
    Unbalanced,
}

/// Whether a throughput window that started at `start` ends `now`. Input loaded ahead lets a
/// system's first stage (routing to the repartition topic) run far ahead of its second: a
/// window between two marks of the last stage's progress alone then holds much less of the
/// first stage's work than of the second's (a 1M-record run's window held 3% of the routing and
/// 47% of the deduplication), and CPU per record looked lower the smaller the input. A window
/// in which both stages did the same number of records measures what a record costs.
fn window_end(start: (u64, u64), now: (u64, u64), total: u64) -> WindowEnd {
    let (routed, done) = now;
    let span = done.saturating_sub(start.1);
    let drift = lead(routed, done) - lead(start.0, start.1);
    let tolerance = (total as f64 * WINDOW_BALANCE) as i64;
    if span as f64 >= total as f64 * WINDOW_MIN_SPAN && drift.abs() <= tolerance {
        WindowEnd::Balanced
    } else if routed >= total && (drift < -tolerance || lead(routed, done) <= tolerance) {
        // The second test: a small run can commit everything in the sample that starts the
        // window, and then nothing moves again.
        WindowEnd::Unbalanced
    } else {
        WindowEnd::Open
    }
}

/// Records/s and CPU of `system` consuming `total` records already in its input, measured in
/// a window from [`WINDOW_START`] of its progress through every stage to the point where both
/// its stages have done the same number of records since ([`window_end`]); then waits until it
/// has committed everything (not timed).
pub fn measure_throughput(system: &mut System, total: u64) -> Throughput {
    measure_instances(std::slice::from_mut(system), total)
}

/// [`measure_throughput`] of a system running as several instances (processes) in one group:
/// their CPU and peak RSS added up. The first instance's log names a stall.
pub fn measure_instances(instances: &mut [System], total: u64) -> Throughput {
    let watcher = instances[0].offsets_watcher();
    let pids: Vec<u32> = instances.iter().map(|s| s.child.id()).collect();
    for instance in instances.iter_mut() {
        instance.wait_ready();
    }
    let mark = |routed: u64, done: u64| Mark {
        at: Instant::now(),
        done,
        routed,
        cpu_s: pids.iter().map(|&pid| cpu_seconds(pid)).sum(),
        machine: MachineCpu::now(),
    };
    let ready = {
        let progress = instances[0].progress(&watcher);
        mark(progress.input, progress.done())
    };
    let from = (total as f64 * WINDOW_START) as u64;
    let mut start: Option<Mark> = None;
    let mut last_move = (Instant::now(), 0);
    let balanced_end = loop {
        for instance in instances.iter_mut() {
            instance.check_alive();
        }
        let progress = instances[0].progress(&watcher);
        let (routed, done) = (progress.input, progress.done());
        match &start {
            None if done >= from => start = Some(mark(routed, done)),
            None => {}
            Some(s) => match window_end((s.routed, s.done), (routed, done), total) {
                WindowEnd::Open => {}
                WindowEnd::Balanced => break Some(mark(routed, done)),
                WindowEnd::Unbalanced => break None,
            },
        }
        if done > last_move.1 {
            last_move = (Instant::now(), done);
        }
        assert!(
            last_move.0.elapsed() < STALL_TIMEOUT,
            "{} made no progress for {STALL_TIMEOUT:?} at {done}/{total}:\n{}",
            instances[0].name,
            log_tail(&instances[0].log)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    instances[0].wait_done(&watcher, total);
    let (start, end, whole_run) = match balanced_end {
        Some(end) => (start.expect("set before the end"), end, false),
        None => (ready, mark(total, total), true),
    };
    // Both stages' records in the window, averaged: in a balanced window they differ by at
    // most the balance; over the whole run, by what the first stage routed before ready.
    let records = (end.done.saturating_sub(start.done) + end.routed.saturating_sub(start.routed))
        as f64
        / 2.0;
    let seconds = end.at.duration_since(start.at).as_secs_f64();
    let cpu = end.cpu_s - start.cpu_s;
    // A window too short to time (a tiny smoke run) gives no figure rather than a wrong one.
    let timed = records > 0.0 && seconds > 0.0;
    let machine_busy_cores = end.machine.busy_cores_since(&start.machine);
    let fig = Throughput {
        records_per_s: if timed { records / seconds } else { f64::NAN },
        cpu_s_per_million: if timed { cpu / records * 1e6 } else { f64::NAN },
        peak_rss_mib: pids.iter().map(|&pid| peak_rss_mib(pid)).sum(),
        machine_busy_cores,
        others_cpu_s_per_million: if timed {
            (machine_busy_cores * seconds - cpu).max(0.0) / records * 1e6
        } else {
            f64::NAN
        },
    };
    println!(
        "  {}{}: {} {}..{} of {total} (first stage {}..{}): {records:.0} records in {seconds:.1} s = {:.0} records/s; {cpu:.1} CPU s = {:.2} CPU s per 1M (the rest of the machine {:.2}); peak RSS {:.0} MiB; machine busy {:.2} of {} cores, load {}",
        instances[0].name,
        if instances.len() > 1 {
            format!(" ({} processes)", instances.len())
        } else {
            String::new()
        },
        if whole_run {
            "the whole run (no window of 25% of the input with as many records of each stage)"
        } else {
            "window"
        },
        start.done,
        end.done,
        start.routed,
        end.routed,
        fig.records_per_s,
        fig.cpu_s_per_million,
        fig.others_cpu_s_per_million,
        fig.peak_rss_mib,
        fig.machine_busy_cores,
        cores(),
        loadavg()
    );
    fig
}

/// One latency run of one system.
#[derive(Clone, Copy)]
pub struct Latency {
    pub rate: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub machine_busy_cores: f64,
}

/// What a latency run needs besides the system.
pub struct LatencyRun<'a> {
    pub output: &'a str,
    pub rate: u64,
    pub warmup: Duration,
    pub window: Duration,
    pub workload: Workload,
}

/// p50/p99 end-to-end latency of `system` at `run.rate` records/s: records are sent at the
/// rate with their send time; after the warm-up, the system must have committed, through
/// every stage, everything sent up to [`BACKLOG_GRACE`] ago — if not, the warm-up is extended
/// (at most [`MAX_REWARMS`] times) and then the run fails (`Err`); the latencies of the
/// records sent in the window that follows are measured: receive time of the output record
/// under read_committed − send time. Returns the figures and what was sent (for the
/// exactly-once check).
pub fn measure_latency(
    system: &mut System,
    run: LatencyRun<'_>,
) -> (Result<Latency, String>, Dataset) {
    let LatencyRun {
        output,
        rate,
        warmup,
        window,
        mut workload,
    } = run;
    let watcher = system.offsets_watcher();
    let receiver = Receiver::start(output, None);
    let producer: BaseProducer = kafka::input_producer_config()
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    let mut ids = std::collections::HashSet::new();
    let mut warmup_until = warmup;
    let mut rewarms = 0;
    // When the window started (elapsed, µs since the epoch, machine CPU), once it has.
    let mut window_start: Option<(Duration, i64, MachineCpu)> = None;
    let mut failure = None;
    let mut last_check = Duration::ZERO;
    let name = system.name.clone();
    let sent = send_paced_while(
        &producer,
        &system.input,
        &mut workload,
        rate,
        |elapsed, sent| {
            if let Some((started, ..)) = window_start {
                if elapsed < started + window {
                    return true;
                }
                // Not asserted (the latencies say it too), but said: whether it stayed steady.
                let done = system.progress(&watcher).done();
                println!(
                    "  {name}: at the end of the window {} of {sent} sent not yet committed through every stage ({:.2} s of input)",
                    sent.saturating_sub(done),
                    sent.saturating_sub(done) as f64 / rate as f64
                );
                return false;
            }
            if elapsed < warmup_until || elapsed < last_check + Duration::from_millis(200) {
                return true;
            }
            last_check = elapsed;
            let due = (elapsed.saturating_sub(BACKLOG_GRACE).as_secs_f64() * rate as f64) as u64;
            let done = system.progress(&watcher).done();
            if done >= due.min(sent) {
                window_start = Some((elapsed, now_us(), MachineCpu::now()));
                println!(
                    "  {name}: no backlog after {:.0} s of warm-up ({done} of {sent} sent committed); window starts",
                    elapsed.as_secs_f64()
                );
                return true;
            }
            if rewarms == MAX_REWARMS {
                failure = Some(format!(
                    "{name}: still a backlog after {:.0} s of warm-up at {rate} records/s ({done} committed, {due} sent more than {BACKLOG_GRACE:?} ago): no steady state, no figure",
                    elapsed.as_secs_f64()
                ));
                return false;
            }
            rewarms += 1;
            warmup_until += warmup;
            println!(
                "  {name}: a backlog after {:.0} s of warm-up ({done} committed, {due} due): warming up {:.0} s more",
                elapsed.as_secs_f64(),
                warmup.as_secs_f64()
            );
            true
        },
        |id| {
            ids.insert(id.into_bytes());
        },
    );
    producer
        .flush(Duration::from_secs(30))
        .expect("flushing the latency input");
    let machine_busy_cores = MachineCpu::now()
        .busy_cores_since(&window_start.map_or_else(MachineCpu::now, |(_, _, machine)| machine));
    let dataset = Dataset {
        records: sent,
        distinct: workload.distinct,
        value_bytes: 0,
        ids,
    };
    system.wait_done(&watcher, sent);
    let from_us = window_start.map_or(i64::MAX, |(_, us, _)| us);
    let mut latencies_us = receiver.finish(workload.distinct as usize, from_us);
    if let Some(failure) = failure {
        return (Err(failure), dataset);
    }
    latencies_us.sort_unstable();
    let fig = Latency {
        rate,
        p50_ms: percentile(&latencies_us, 0.50) / 1000.0,
        p99_ms: percentile(&latencies_us, 0.99) / 1000.0,
        machine_busy_cores,
    };
    println!(
        "  {name}: {rate} records/s, {sent} sent, {} output records in the window: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; machine busy {:.2} of {} cores, load {}",
        latencies_us.len(),
        fig.p50_ms,
        fig.p99_ms,
        latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
        fig.machine_busy_cores,
        cores(),
        loadavg()
    );
    (Ok(fig), dataset)
}
