//! Latency: each system at the same share of its own median throughput (or one rate for all),
//! on fresh topics, at its best `linger.ms`; the runs and their order as in the other phases.
//! The phase begins with one run that is not counted, to warm the broker (see [`phase`]).

use std::path::Path;

use crate::Settings;
use crate::common::*;
use crate::steady::{self, Latency, LatencyRun};
use crate::sweep::Best;
use crate::systems::{App, Peer};

/// What the phase measured.
pub struct Phase {
    pub figures: Vec<(Peer, Latency)>,
    /// Whether every counted run reached a steady state (a figure).
    pub steady_state: bool,
}

/// Runs the latency phase with the loads and lingers of `best`. `None` when an output was not
/// exactly once: the caller stops there, and that run's topics and work dir are kept.
pub fn phase(
    topics: &mut Topics<'_>,
    work: &Path,
    settings: &Settings,
    best: &Best,
    run: &str,
) -> Option<Phase> {
    let mut measured = Phase {
        figures: Vec::new(),
        steady_state: true,
    };
    if !settings.runs("latency") {
        return Some(measured);
    }
    let rates: Vec<(Peer, u64)> = Peer::LATENCY
        .into_iter()
        .map(|p| (p, rate(settings, best, p)))
        .collect();
    println!(
        "latency at {}% of each system's own median throughput ({}), {:?} warm-up (no backlog required after it), {:?} window, each system on fresh topics",
        settings.latency_percent,
        rates
            .iter()
            .map(|(p, r)| format!("{} {r}/s", p.name()))
            .collect::<Vec<_>>()
            .join(", "),
        settings.latency_warmup,
        settings.latency_duration
    );
    let rate_of = |peer: Peer| rates.iter().find(|(p, _)| *p == peer).expect("a rate").1;
    // On a broker that had just started (the phase run on its own, after a restart), the first
    // system measured reached no steady state at all: its first 30 s committed about a third of
    // what was sent, and it was still behind when the warm-up's last extension ended. So the
    // phase begins with one run of the first system in order, run as the counted runs are but
    // not counted, and every counted run finds a broker that has served this load already.
    if let Some(&peer) = settings.order(Peer::LATENCY, 0).first() {
        println!("broker warm-up: one run not counted");
        let id = format!("{run}-lwarm-{}", peer.name());
        match latency_run(topics, work, settings, best, peer, rate_of(peer), &id)? {
            Ok(_) => println!("  {}: warm-up run done, its figures not kept", peer.name()),
            Err(failure) => println!("  warm-up run not steady, not counted: {failure}"),
        }
    }
    for r in 0..settings.runs {
        println!("latency run {}/{}:", r + 1, settings.runs);
        for peer in settings.order(Peer::LATENCY, r) {
            let id = format!("{run}-l{r}-{}", peer.name());
            match latency_run(topics, work, settings, best, peer, rate_of(peer), &id)? {
                Ok(fig) => measured.figures.push((peer, fig)),
                Err(failure) => {
                    println!("  LATENCY RUN FAILED: {failure}");
                    measured.steady_state = false;
                }
            }
        }
    }
    Some(measured)
}

/// The load `peer` is measured at: `BENCH_LATENCY_RATE` when set, else its share of its median
/// throughput, rounded to 100 records/s.
fn rate(settings: &Settings, best: &Best, peer: Peer) -> u64 {
    let own = best.rate(peer) * settings.latency_percent as f64 / 100.0;
    settings.latency_rate.unwrap_or(if own.is_finite() {
        ((own / 100.0).round() as u64 * 100).max(100)
    } else {
        // A throughput too small to time (a tiny run): a small fixed load.
        1_000
    })
}

/// One latency run of `peer` at `rate` records/s on fresh topics named after `id`, at its best
/// linger.ms: its figures, or why it has none (no steady state). `None` when its output was not
/// exactly once.
fn latency_run(
    topics: &mut Topics<'_>,
    work: &Path,
    settings: &Settings,
    best: &Best,
    peer: Peer,
    rate: u64,
    id: &str,
) -> Option<Result<Latency, String>> {
    let input = format!("{id}-in");
    topics.create(&[&input]);
    let options = AppOptions {
        linger_ms: best.linger(peer),
        ..settings.options(settings.retention)
    };
    let app = App::create(topics, work, peer, id, &input, &options);
    let mut system = app.start(settings);
    system.wait_ready();
    // Repeats within a quarter retention of wall-clock time.
    let recent = rate * settings.retention.as_secs() / 4;
    let (result, sent) = steady::measure_latency(
        &mut system,
        LatencyRun {
            output: &app.output,
            rate,
            warmup: settings.latency_warmup,
            window: settings.latency_duration,
            workload: Workload::new().keyed(settings.keying).recent(recent),
        },
    );
    system.stop();
    if !app.check(&format!("  {}", peer.name()), &sent).correct {
        println!("AN OUTPUT WAS NOT EXACTLY ONCE: stopping here (work dir kept)");
        return None;
    }
    app.remove(topics);
    topics.delete(&[input]);
    Some(result)
}
