//! The pod's entry in `status.pods`, computed from one observation: a pure function, so every
//! rule about what is reported is a unit test.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use streamapp_api::crd::{PodStateStatus, RestoreStatus, TaskStateStatus};
use streamapp_api::health::{ProcessorHealth, ProcessorPhase, TaskHealth};
use streamapp_api::status_values::PodPhase;

use streamapp_api::state_volume::QuarantinedStore;

use crate::disk::{DiskReport, TaskDisk};
use crate::observe::{HealthFile, Probes};

/// Below this share of free space on the state volume the entry says so: RocksDB compactions
/// need room, and a full volume stops the processor.
const LOW_FREE_SPACE_PERCENT: u64 = 10;

/// The entry for pod `pod`, from what was seen at `now_ms` (Unix ms).
pub fn pod_status(
    pod: &str,
    health: &HealthFile,
    disk: &DiskReport,
    probes: &Probes,
    now_ms: i64,
) -> PodStateStatus {
    let file = health.present();
    // Up: answers /healthz. Alive: up, or at least its process is still there (busy starting,
    // or too slow to answer), so the file is still its own account of itself.
    let alive = probes.healthz || probes.pid_alive;
    let file_phase = file.map(|h| h.phase);
    // A new volume: the agent (a native sidecar) starts before the processor ever did.
    let fresh_volume = matches!(health, HealthFile::Missing) && disk.tasks.is_empty();
    let phase = match (file_phase, alive) {
        (Some(p), true) => PodPhase::from(p),
        (None, true) => PodPhase::Starting,
        (None, false) if fresh_volume => PodPhase::Starting,
        // A drained or failed processor exits: that is its final state, not an outage.
        (Some(p @ (ProcessorPhase::Drained | ProcessorPhase::Failed)), false) => PodPhase::from(p),
        // No processor runs and the last one did not stop cleanly (or none ever started on
        // this volume).
        (_, false) => PodPhase::Down,
    };
    let last_shutdown_clean = match (file, alive) {
        (Some(h), _) if h.phase == ProcessorPhase::Drained => Some(true),
        // The processor is gone without a drain: whatever the next start will say, this
        // shutdown was not clean.
        (Some(_), false) => Some(false),
        (Some(h), true) => h.previous_shutdown_clean,
        (None, _) => None,
    };

    let tasks = tasks(file, disk, alive, now_ms);
    let quarantines = disk
        .quarantines
        .len()
        .max(file.map_or(0, |h| h.tasks.iter().map(|t| t.quarantines.len()).sum()));

    let mut status = PodStateStatus {
        name: pod.to_string(),
        uid: None,
        reported_at: Some(rfc3339(now_ms)),
        phase: Some(phase),
        processor_up: probes.healthz,
        ready: probes.readyz,
        last_shutdown_clean,
        drain_duration_ms: file
            .and_then(|h| h.drain_duration_ms)
            .and_then(|d| i64::try_from(d).ok()),
        drain_requested_by: file.and_then(|h| h.drain_requested_by).map(Into::into),
        free_disk_bytes: disk.free_bytes.and_then(|b| i64::try_from(b).ok()),
        quarantines: i32::try_from(quarantines).unwrap_or(i32::MAX),
        dead_letters: file.map_or(0, |h| {
            i64::try_from(h.dead_letters.values().sum::<u64>()).unwrap_or(i64::MAX)
        }),
        miskeyed_records: file.map_or(0, |h| i64::try_from(h.miskeyed_records).unwrap_or(i64::MAX)),
        skipped_changelog_records: file.map_or(0, |h| {
            i64::try_from(h.skipped_changelog_records).unwrap_or(i64::MAX)
        }),
        last_skipped_changelog_record: file.and_then(|h| h.last_skipped_changelog_record.clone()),
        last_dead_letter: file.and_then(|h| h.last_dead_letter.as_ref()).map(|d| {
            format!(
                "{} at {} ({}): {}",
                d.reason,
                rfc3339(d.at_ms),
                d.source,
                d.detail
            )
        }),
        input_partitions: file
            .and_then(|h| h.input_partitions)
            .and_then(|n| i32::try_from(n).ok()),
        message: None,
        tasks,
    };
    status.message = message(health, disk, probes, alive, &status);
    status
}

/// RFC 3339 in whole seconds, as Kubernetes writes times.
pub fn rfc3339(ms: i64) -> String {
    Timestamp::from_second(ms.div_euclid(1000))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn age_seconds(now_ms: i64, then_ms: i64) -> i64 {
    (now_ms - then_ms).max(0) / 1000
}

/// The processor's tasks (from its file), completed with what the disk says. Without a file,
/// the task directories on disk are all there is to go by.
fn tasks(
    file: Option<&ProcessorHealth>,
    disk: &DiskReport,
    alive: bool,
    now_ms: i64,
) -> Vec<TaskStateStatus> {
    let empty = TaskHealth::default();
    let mut by_partition: BTreeMap<i32, (&TaskHealth, Option<&TaskDisk>)> = BTreeMap::new();
    match file {
        Some(h) => {
            for t in &h.tasks {
                by_partition.insert(t.partition, (t, disk.tasks.get(&t.partition)));
            }
        }
        None => {
            for (p, d) in &disk.tasks {
                by_partition.insert(*p, (&empty, Some(d)));
            }
        }
    }
    by_partition
        .into_iter()
        .map(|(partition, (t, d))| task_status(partition, t, d, &disk.quarantines, alive, now_ms))
        .collect()
}

fn task_status(
    partition: i32,
    t: &TaskHealth,
    d: Option<&TaskDisk>,
    quarantined: &[QuarantinedStore],
    alive: bool,
    now_ms: i64,
) -> TaskStateStatus {
    let restore_lag = t
        .changelog_end_offset
        .map(|end| (end - t.store_changelog_offset.unwrap_or(0)).max(0));
    // Only while a live processor restores: a dead one's unfinished restore starts over.
    let restore = t
        .restore
        .as_ref()
        .filter(|r| alive && r.finished_at_ms.is_none())
        .map(|r| {
            let restored = i64::try_from(r.records_restored).unwrap_or(i64::MAX);
            let total = i64::try_from(r.records_to_restore).unwrap_or(i64::MAX);
            let elapsed_s = (now_ms - r.started_at_ms) as f64 / 1000.0;
            let rate = (elapsed_s >= 1.0).then(|| (restored as f64 / elapsed_s) as i64);
            let eta_seconds = rate
                .filter(|r| *r > 0)
                .map(|r| (total - restored).max(0) / r);
            RestoreStatus {
                restored,
                total,
                rate,
                eta_seconds,
                waiting_for_transaction_at: r.waiting_for_transaction_at,
            }
        });
    // The newest evidence of a durable commit: the processor's own record, or the drain's
    // checkpoint file.
    let checkpoint_at = [
        t.last_checkpoint_at_ms,
        d.and_then(|d| d.checkpoint.as_ref())
            .map(|c| c.written_at_ms),
    ]
    .into_iter()
    .flatten()
    .max();
    // The agent's own count of WAL files when the task dir is there; the file's otherwise.
    let (wal_files, wal_bytes, wal_oldest_age_seconds) = match d {
        Some(d) => (
            d.wal.files,
            d.wal.bytes,
            d.wal.oldest_modified_ms.map(|m| age_seconds(now_ms, m)),
        ),
        None => (
            t.wal.files,
            t.wal.bytes,
            t.wal.oldest_age_seconds.and_then(|s| i64::try_from(s).ok()),
        ),
    };
    // Quarantines: the folder on disk, and what the processor reported (the folder is pruned
    // and may be on a volume this agent cannot see), one entry per time.
    let mut q: BTreeMap<i64, &str> = quarantined
        .iter()
        .filter(|q| q.partition == partition)
        .map(|q| (q.at_ms, q.reason.as_str()))
        .collect();
    for r in &t.quarantines {
        q.entry(r.at_ms).or_insert(r.reason.as_str());
    }
    let last = q.iter().next_back();
    TaskStateStatus {
        partition,
        state: t.state.map(Into::into),
        backoff: t
            .backoff
            .as_ref()
            .map(|b| format!("{:?}: {}", b.kind, b.reason)),
        backoff_since: t.backoff.as_ref().map(|b| rfc3339(b.since_ms)),
        committed_offset: t.committed_offset,
        changelog_end: t.changelog_end_offset,
        restore_lag,
        restore,
        // A dead processor waits for nothing.
        input_waiting_for_transaction_at: t.input_waiting_for_transaction_at.filter(|_| alive),
        opened: t.opened.map(Into::into),
        checkpoint_age_seconds: checkpoint_at.map(|at| age_seconds(now_ms, at)),
        wal_files: i64::try_from(wal_files).unwrap_or(i64::MAX),
        wal_bytes: i64::try_from(wal_bytes).unwrap_or(i64::MAX),
        wal_oldest_age_seconds,
        quarantines: i32::try_from(q.len()).unwrap_or(i32::MAX),
        last_quarantine_reason: last.map(|(_, r)| r.to_string()),
        last_quarantine_at: last.map(|(at, _)| rfc3339(*at)),
    }
}

/// Why the state is not healthy, or `None` when it is.
fn message(
    health: &HealthFile,
    disk: &DiskReport,
    probes: &Probes,
    alive: bool,
    status: &PodStateStatus,
) -> Option<String> {
    let mut why: Vec<String> = Vec::new();
    let file = health.present();
    match (health, alive) {
        (HealthFile::Unreadable(e), _) => {
            why.push(format!("the processor's health file is unreadable: {e}"))
        }
        (HealthFile::Missing, false) => {
            why.push("no processor has run on this state volume yet".into())
        }
        (HealthFile::Missing, true) => {
            why.push("the processor has not written its health file yet".into())
        }
        (HealthFile::Present(_), _) => {}
    }
    if let Some(h) = file {
        match (h.phase, alive) {
            (ProcessorPhase::Failed, _) => {
                why.push(format!(
                    "the processor failed: {}",
                    h.error.as_deref().unwrap_or("no reason given")
                ));
            }
            (ProcessorPhase::Drained, _) => {
                why.push("the processor drained and is stopping".into())
            }
            (p, false) => why.push(format!(
                "the processor is not running (last seen {} at {}); it stopped without a drain",
                PodPhase::from(p),
                rfc3339(h.updated_at_ms)
            )),
            (ProcessorPhase::Starting, true) => why.push("the processor is starting".into()),
            (ProcessorPhase::Draining, true) => why.push("the processor is draining".into()),
            (ProcessorPhase::Restoring, true) => {
                let restoring: Vec<String> = status
                    .tasks
                    .iter()
                    .filter_map(|t| {
                        t.restore.as_ref().map(|r| {
                            let waiting = r.waiting_for_transaction_at.map_or(String::new(), |at| {
                                format!(" (waiting for an open transaction at offset {at} to end)")
                            });
                            format!(
                                "partition {} {}/{}{waiting}",
                                t.partition, r.restored, r.total
                            )
                        })
                    })
                    .collect();
                why.push(format!(
                    "restoring state from the changelog: {}",
                    restoring.join(", ")
                ));
            }
            (ProcessorPhase::Running, true) if !probes.healthz => why.push(
                "the processor does not answer /healthz: its processing loop is stuck, or the process is".into(),
            ),
            (ProcessorPhase::Running, true) if !probes.readyz => why.push(match &h.not_ready_reason {
                Some(reason) => format!("the processor is not ready: {reason}"),
                None => "the processor does not answer /readyz".into(),
            }),
            (ProcessorPhase::Running, true) => {}
        }
        // Stores that cannot be used for now: the processor retries them; a person may have to
        // free space or fix the volume.
        for t in &h.tasks {
            if let Some(b) = &t.backoff {
                why.push(format!(
                    "the store of partition {} is unavailable since {} ({:?}: {}); the processor retries it \
                     (attempt {}), nothing was quarantined",
                    t.partition,
                    rfc3339(b.since_ms),
                    b.kind,
                    b.reason,
                    b.attempts
                ));
            }
        }
        // A task whose input stands at a transaction that stays open processes nothing.
        for t in status.tasks.iter() {
            if let Some(at) = t.input_waiting_for_transaction_at {
                why.push(format!(
                    "partition {} reads nothing past offset {at} of its input: a transaction open \
                     there has not ended",
                    t.partition
                ));
            }
        }
        // Quarantines of this run: the store was damaged and rebuilt. Older ones stay on disk for
        // forensics but are history, not a reason for concern now.
        for t in &h.tasks {
            for q in t.quarantines.iter().filter(|q| q.at_ms >= h.started_at_ms) {
                why.push(format!(
                    "the store of partition {} was quarantined and rebuilt: {}",
                    t.partition, q.reason
                ));
            }
        }
    }
    if let (Some(free), Some(total)) = (disk.free_bytes, disk.total_bytes)
        && total > 0
        && free.saturating_mul(100) / total < LOW_FREE_SPACE_PERCENT
    {
        why.push(format!(
            "the state volume is almost full: {free} of {total} bytes free"
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The entry with what changes all the time taken out (times, ages, offsets, byte counts): a
/// change in what is left is worth a write at once; the rest goes out with the heartbeat.
/// Offsets move with every commit (every 100 ms under load), so they are reported on the
/// heartbeat, but a restore lag that changes its order of magnitude, or a restore that
/// advances by a tenth, is news.
pub fn significant(status: &PodStateStatus) -> PodStateStatus {
    let mut s = status.clone();
    s.reported_at = None;
    s.free_disk_bytes = None;
    for t in &mut s.tasks {
        t.committed_offset = None;
        t.changelog_end = None;
        t.restore_lag = t.restore_lag.map(order_of_magnitude);
        t.restore = t.restore.as_ref().map(|r| RestoreStatus {
            restored: if r.total > 0 {
                r.restored.saturating_mul(10) / r.total
            } else {
                0
            },
            total: r.total,
            rate: None,
            eta_seconds: None,
            waiting_for_transaction_at: r.waiting_for_transaction_at,
        });
        t.checkpoint_age_seconds = None;
        t.wal_bytes = 0;
        t.wal_oldest_age_seconds = None;
    }
    s
}

/// 0 for 0, 1 for 1..=9, 2 for 10..=99, …
fn order_of_magnitude(n: i64) -> i64 {
    if n <= 0 { 0 } else { i64::from(n.ilog10()) + 1 }
}

#[cfg(test)]
mod tests;
