//! Scaling out: the same application run as 1, 2 and 4 processes (pods) of one group on an
//! input of 8 partitions, each process one processing thread. Measured like the throughput
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

/// One scaling run: how many processes, and what they did together.
#[derive(Clone, Copy)]
pub struct ScalingRun {
    pub processes: usize,
    pub figures: Throughput,
}

/// Runs streamapp on `input` (already holding `dataset`) as `processes` processes, measures
/// them and checks the output. Returns the figures and the check.
pub fn run_processes(
    settings: &Settings,
    topics: &mut Topics<'_>,
    work: &Path,
    id: &str,
    input: &str,
    dataset: &Dataset,
    processes: usize,
) -> (ScalingRun, OutputCheck) {
    let options = AppOptions {
        partitions: PARTITIONS,
        ..settings.options(RETENTION)
    };
    let app = App::create(topics, work, Peer::Streamapp, id, input, &options);
    let mut instances: Vec<System> = (0..processes)
        .map(|i| app.start_instance(settings, &format!("bench-{i}")))
        .collect();
    let figures = measure_instances(&mut instances, dataset.records);
    for instance in instances {
        instance.stop();
    }
    let check = app.check(&format!("  streamapp, {processes} process(es)"), dataset);
    if check.correct {
        app.remove(topics);
    }
    (ScalingRun { processes, figures }, check)
}
