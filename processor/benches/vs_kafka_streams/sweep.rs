//! The throughput phase's `linger.ms` sweep: each system measured at every value of
//! `BENCH_LINGERS`, and reported at its best; and what the latency phase takes from it (each
//! system's best linger and its median throughput), measured in the same run or read from the
//! CSV of an earlier one (`BENCH_THROUGHPUT_FROM`).

use std::path::Path;

use crate::common::LINGER_MS;
use crate::report;
use crate::steady::Throughput;
use crate::systems::Peer;

/// The table's row of each system's median throughput (at its best linger).
pub const THROUGHPUT_ROW: &str = "throughput (steady window)";
/// The table's row of each system's best `linger.ms`.
pub const BEST_LINGER_ROW: &str = "producer linger.ms (each system's best of the sweep)";

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
        let note = if peer.swept() { "" } else { " (not swept)" };
        println!("  {:<18} {}{note}", peer.name(), cells.join(", "));
    }
}

/// What the latency phase needs of the throughput phase: each system's median throughput (its
/// load is a share of it) and its best `linger.ms` (it runs at it).
pub struct Best {
    rates: Vec<(Peer, f64)>,
    lingers: Vec<(Peer, u32)>,
}

impl Best {
    /// From this run's throughput phase: each system's median at its best `linger.ms`.
    pub fn measured(sweep: &[(Peer, u32, Throughput)], lingers: &[(Peer, u32)]) -> Best {
        Best {
            rates: lingers
                .iter()
                .map(|&(peer, linger)| {
                    (peer, sweep_median(sweep, peer, linger, |t| t.records_per_s))
                })
                .collect(),
            lingers: lingers.to_vec(),
        }
    }

    /// From the CSV an earlier run wrote (`BENCH_THROUGHPUT_FROM`), so that a full run can be
    /// split in two: the throughput phase, then the others at the loads and lingers it found.
    pub fn from_csv(path: &Path) -> Result<Best, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let header: Vec<&str> = text
            .lines()
            .next()
            .ok_or("an empty file")?
            .split(',')
            .collect();
        // The two rows' names hold no comma, so their fields split plainly.
        let row = |name: &str| -> Result<Vec<(Peer, f64)>, String> {
            let fields: Vec<&str> = text
                .lines()
                .find(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(','))
                })
                .ok_or(format!("no row \"{name}\""))?
                .split(',')
                .collect();
            Ok(Peer::ALL
                .into_iter()
                .filter_map(|peer| {
                    let column = header.iter().position(|h| *h == peer.column())?;
                    Some((peer, fields.get(column)?.parse().ok()?))
                })
                .collect())
        };
        let best = Best {
            rates: row(THROUGHPUT_ROW)?,
            lingers: row(BEST_LINGER_ROW)?
                .into_iter()
                .map(|(peer, linger)| (peer, linger as u32))
                .collect(),
        };
        if best.rates.is_empty() {
            return Err(format!(
                "no system's throughput in the row \"{THROUGHPUT_ROW}\""
            ));
        }
        Ok(best)
    }

    /// `peer`'s median throughput; NaN when it was not measured.
    pub fn rate(&self, peer: Peer) -> f64 {
        self.rates
            .iter()
            .find(|(p, _)| *p == peer)
            .map_or(f64::NAN, |(_, r)| *r)
    }

    /// `peer`'s best `linger.ms`; the default when it was not swept.
    pub fn linger(&self, peer: Peer) -> u32 {
        self.lingers
            .iter()
            .find(|(p, _)| *p == peer)
            .map_or(LINGER_MS, |(_, l)| *l)
    }
}
