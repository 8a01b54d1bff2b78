//! Scaling out and up: the same application run as 1, 2 and 4 processes (pods) of one group on
//! an input of 8 partitions, each process one processing thread, and as one process with 2
//! processing threads (`processingThreads`). Measured like the throughput
//! phase (the steady window of the input committed through every stage), with the CPU and
//! memory of all processes added up and how busy the whole machine was: where the processes
//! stop adding throughput, that figure says whether the machine was the limit. The input's
//! record times are those of the load and the retention the full hour, so nothing expires (see
//! the phase in `main.rs`).

use std::path::Path;

use crate::Settings;
use crate::common::*;
use crate::steady::{Throughput, measure_instances};
use crate::systems::{App, Peer};

/// The input's partitions: room for 4 processes of 2 tasks each.
pub const PARTITIONS: i32 = 8;

/// How the application runs: how many processes, each with how many processing threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub processes: u64,
    pub threads: u64,
}

impl Shape {
    /// The table's label (no comma: it is a CSV field too).
    pub fn label(&self) -> String {
        let threads = match self.threads {
            1 => String::new(),
            n => format!(" with {n} threads"),
        };
        format!(
            "scaling: {} process(es){threads} on {PARTITIONS} partitions",
            self.processes
        )
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} process(es) x {} thread(s)",
            self.processes, self.threads
        )
    }
}

/// The shapes measured: each count of `processes` with one thread, then one process with each
/// count of `threads` above one.
pub fn shapes(processes: &[u64], threads: &[u64]) -> Vec<Shape> {
    let mut shapes: Vec<Shape> = processes
        .iter()
        .map(|&processes| Shape {
            processes,
            threads: 1,
        })
        .collect();
    shapes.extend(threads.iter().filter(|&&t| t > 1).map(|&threads| Shape {
        processes: 1,
        threads,
    }));
    shapes
}

/// One scaling run: how the application ran, and what its processes did together.
#[derive(Clone, Copy)]
pub struct ScalingRun {
    pub shape: Shape,
    pub figures: Throughput,
}

/// Runs streamapp on `input` (already holding `dataset`) in `shape`, measures its processes and
/// checks the output. Returns the figures and the check.
pub fn run_processes(
    settings: &Settings,
    topics: &mut Topics<'_>,
    work: &Path,
    id: &str,
    input: &str,
    dataset: &Dataset,
    shape: Shape,
) -> (ScalingRun, OutputCheck) {
    let options = AppOptions {
        partitions: PARTITIONS,
        processing_threads: shape.threads as u32,
        ..settings.options(RETENTION)
    };
    let app = App::create(topics, work, Peer::Streamapp, id, input, &options);
    let mut instances: Vec<System> = (0..shape.processes)
        .map(|i| app.start_instance(settings, &format!("bench-{i}")))
        .collect();
    let figures = measure_instances(&mut instances, dataset.records);
    for instance in instances {
        instance.stop();
    }
    let check = app.check(&format!("  streamapp, {shape}"), dataset);
    if check.correct {
        app.remove(topics);
    }
    (ScalingRun { shape, figures }, check)
}
