//! The throughput phase's `linger.ms` sweep: each system measured at every value of
//! `BENCH_LINGERS`, and reported at its best.

use crate::report;
use crate::steady::Throughput;
use crate::systems::Peer;

/// Each system's best `linger.ms` of the sweep: the one of its highest median throughput (a
/// figure wins over none, from a window too short to time).
pub fn best_lingers(sweep: &[(Peer, u32, Throughput)]) -> Vec<(Peer, u32)> {
    let mut chosen: Vec<(Peer, u32, f64)> = Vec::new();
    for &(peer, linger, _) in sweep {
        let rate = sweep_median(sweep, peer, linger, |t| t.records_per_s);
        match chosen.iter_mut().find(|(p, _, _)| *p == peer) {
            None => chosen.push((peer, linger, rate)),
            Some(c) if rate > c.2 || (c.2.is_nan() && !rate.is_nan()) => *c = (peer, linger, rate),
            Some(_) => {}
        }
    }
    chosen.into_iter().map(|(p, l, _)| (p, l)).collect()
}

/// The median of `f` over the sweep's runs of `peer` at `linger`.
fn sweep_median(
    sweep: &[(Peer, u32, Throughput)],
    peer: Peer,
    linger: u32,
    f: fn(&Throughput) -> f64,
) -> f64 {
    let values: Vec<f64> = sweep
        .iter()
        .filter(|(p, l, _)| (*p, *l) == (peer, linger))
        .map(|(_, _, t)| f(t))
        .collect();
    report::Stats::of(&values).map_or(f64::NAN, |s| s.median)
}

/// The sweep: each system's median throughput and CPU per 1M records at each `linger.ms`, its
/// best marked.
pub fn print_linger_sweep(sweep: &[(Peer, u32, Throughput)], best_linger: &[(Peer, u32)]) {
    println!("linger.ms sweep (median records/s, CPU s per 1M; * each system's best):");
    for &(peer, best) in best_linger {
        let mut lingers: Vec<u32> = sweep
            .iter()
            .filter(|(p, _, _)| *p == peer)
            .map(|(_, l, _)| *l)
            .collect();
        lingers.sort_unstable();
        lingers.dedup();
        let cells: Vec<String> = lingers
            .into_iter()
            .map(|linger| {
                format!(
                    "{linger} ms{} {:.0}/s {:.2}",
                    if linger == best { "*" } else { "" },
                    sweep_median(sweep, peer, linger, |t| t.records_per_s),
                    sweep_median(sweep, peer, linger, |t| t.cpu_s_per_million)
                )
            })
            .collect();
        if !peer.takes_linger() {
            // Measured once a run, at the library's own linger (100 ms under EOS).
            let rate = sweep_median(sweep, peer, best, |t| t.records_per_s);
            let cpu = sweep_median(sweep, peer, best, |t| t.cpu_s_per_million);
            println!(
                "  {:<18} its library default {rate:.0}/s {cpu:.2}",
                peer.name()
            );
            continue;
        }
        println!("  {:<18} {}", peer.name(), cells.join(", "));
    }
}
