//! The pod's entry in `status.pods`, computed from one observation: a pure function, so every
//! rule about what is reported is a unit test.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use streamapp_api::crd::{PodStateStatus, RestoreStatus, TaskStateStatus};
use streamapp_api::health::{ProcessorHealth, ProcessorPhase, StoreOpen, TaskHealth};

use crate::disk::{DiskReport, QuarantinedStore, TaskDisk};
use crate::observe::{HealthFile, Probes};

/// Phase reported when no processor runs and the last one did not stop cleanly (or none ever
/// started on this volume).
pub const PHASE_DOWN: &str = "Down";

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
        (Some(p), true) => phase_name(p),
        (None, true) => phase_name(ProcessorPhase::Starting),
        (None, false) if fresh_volume => phase_name(ProcessorPhase::Starting),
        // A drained or failed processor exits: that is its final state, not an outage.
        (Some(p @ (ProcessorPhase::Drained | ProcessorPhase::Failed)), false) => phase_name(p),
        (_, false) => PHASE_DOWN,
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
        reported_at: Some(rfc3339(now_ms)),
        phase: Some(phase.to_string()),
        processor_up: probes.healthz,
        ready: probes.readyz,
        last_shutdown_clean,
        drain_duration_ms: file
            .and_then(|h| h.drain_duration_ms)
            .and_then(|d| i64::try_from(d).ok()),
        drain_requested_by: file
            .and_then(|h| h.drain_requested_by)
            .map(|by| format!("{by:?}")),
        free_disk_bytes: disk.free_bytes.and_then(|b| i64::try_from(b).ok()),
        quarantines: i32::try_from(quarantines).unwrap_or(i32::MAX),
        dead_letters: file.map_or(0, |h| {
            i64::try_from(h.dead_letters.values().sum::<u64>()).unwrap_or(i64::MAX)
        }),
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

/// The phase as the CRD spells it.
pub fn phase_name(phase: ProcessorPhase) -> &'static str {
    match phase {
        ProcessorPhase::Starting => "Starting",
        ProcessorPhase::Restoring => "Restoring",
        ProcessorPhase::Running => "Running",
        ProcessorPhase::Draining => "Draining",
        ProcessorPhase::Drained => "Drained",
        ProcessorPhase::Failed => "Failed",
    }
}

fn open_name(open: StoreOpen) -> &'static str {
    match open {
        StoreOpen::Clean => "Clean",
        StoreOpen::ReplayedTail => "ReplayedTail",
        StoreOpen::FullRestore => "FullRestore",
        StoreOpen::Rebuilt => "Rebuilt",
        StoreOpen::Resumed => "Resumed",
    }
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
        state: t.state.map(|s| format!("{s:?}")),
        backoff: t
            .backoff
            .as_ref()
            .map(|b| format!("{:?}: {}", b.kind, b.reason)),
        backoff_since: t.backoff.as_ref().map(|b| rfc3339(b.since_ms)),
        committed_offset: t.committed_offset,
        changelog_end: t.changelog_end_offset,
        restore_lag,
        restore,
        opened: t.opened.map(|o| open_name(o).to_string()),
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
                phase_name(p),
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
                            format!("partition {} {}/{}", t.partition, r.restored, r.total)
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
mod tests {
    use super::*;
    use crate::disk::{CheckpointFile, WalOnDisk};
    use streamapp_api::health::{
        DeadLetterNote, Quarantine, RestoreProgress, StoreBackoff, StoreUnavailable, TaskState,
        WalFiles,
    };

    const NOW: i64 = 1_750_000_000_000;

    fn up() -> Probes {
        Probes {
            healthz: true,
            readyz: true,
            pid_alive: true,
        }
    }

    fn gone() -> Probes {
        Probes::default()
    }

    fn running() -> ProcessorHealth {
        ProcessorHealth {
            phase: ProcessorPhase::Running,
            pid: 4242,
            started_at_ms: NOW - 60_000,
            updated_at_ms: NOW - 500,
            previous_shutdown_clean: Some(true),
            tasks: vec![TaskHealth {
                partition: 0,
                state: Some(TaskState::Active),
                committed_offset: Some(120),
                store_changelog_offset: Some(95),
                changelog_end_offset: Some(100),
                opened: Some(StoreOpen::Clean),
                last_checkpoint_at_ms: Some(NOW - 3_000),
                wal: WalFiles {
                    files: 9,
                    bytes: 9,
                    oldest_age_seconds: Some(9),
                },
                ..Default::default()
            }],
            ..ProcessorHealth::new("pod-0", "app", NOW - 60_000)
        }
    }

    fn file(h: ProcessorHealth) -> HealthFile {
        HealthFile::Present(Box::new(h))
    }

    fn disk_with_task0() -> DiskReport {
        let mut disk = DiskReport {
            free_bytes: Some(800),
            total_bytes: Some(1000),
            ..Default::default()
        };
        disk.tasks.insert(
            0,
            TaskDisk {
                checkpoint: None,
                wal: WalOnDisk {
                    files: 2,
                    bytes: 4096,
                    oldest_modified_ms: Some(NOW - 42_000),
                },
            },
        );
        disk
    }

    #[test]
    fn a_running_processor_reports_offsets_lag_and_the_wal_the_agent_found_on_disk() {
        let s = pod_status("pod-0", &file(running()), &disk_with_task0(), &up(), NOW);
        assert_eq!(s.name, "pod-0");
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert!(s.processor_up && s.ready);
        assert_eq!(s.last_shutdown_clean, Some(true));
        assert_eq!(s.free_disk_bytes, Some(800));
        assert_eq!(s.message, None, "healthy: no message");
        assert_eq!(s.reported_at.as_deref(), Some("2025-06-15T15:06:40Z"));
        assert_eq!(
            s.tasks,
            vec![TaskStateStatus {
                partition: 0,
                state: Some("Active".into()),
                backoff: None,
                backoff_since: None,
                committed_offset: Some(120),
                changelog_end: Some(100),
                restore_lag: Some(5),
                restore: None,
                opened: Some("Clean".into()),
                checkpoint_age_seconds: Some(3),
                wal_files: 2,
                wal_bytes: 4096,
                wal_oldest_age_seconds: Some(42),
                quarantines: 0,
                last_quarantine_reason: None,
                last_quarantine_at: None,
            }]
        );
    }

    #[test]
    fn a_store_backing_off_on_a_full_disk_is_reported_with_its_reason_and_start() {
        let mut h = running();
        h.tasks[0].state = Some(TaskState::BackingOff);
        h.tasks[0].backoff = Some(StoreBackoff {
            kind: StoreUnavailable::DiskFull,
            reason: "IO error: No space left on device".into(),
            since_ms: NOW - 30_000,
            attempts: 4,
            retry_at_ms: NOW + 8_000,
        });
        h.not_ready_reason = Some("partition 0 backs off (DiskFull: ...)".into());
        let probes = Probes {
            readyz: false,
            ..up()
        };
        let s = pod_status("pod-0", &file(h), &disk_with_task0(), &probes, NOW);
        let t = &s.tasks[0];
        assert_eq!(t.state.as_deref(), Some("BackingOff"));
        assert_eq!(
            t.backoff.as_deref(),
            Some("DiskFull: IO error: No space left on device")
        );
        assert_eq!(t.backoff_since.as_deref(), Some("2025-06-15T15:06:10Z"));
        assert_eq!(t.quarantines, 0);
        let msg = s.message.unwrap();
        assert!(
            msg.contains("partition 0 is unavailable since 2025-06-15T15:06:10Z (DiskFull"),
            "{msg}"
        );
        assert!(msg.contains("nothing was quarantined"), "{msg}");
        assert!(msg.contains("not ready: partition 0 backs off"), "{msg}");
    }

    #[test]
    fn dead_letters_and_the_input_partitions_are_reported() {
        let mut h = running();
        h.dead_letters = [
            ("processing-failed".to_string(), 3),
            ("value-too-large".to_string(), 2),
        ]
        .into();
        h.last_dead_letter = Some(DeadLetterNote {
            at_ms: NOW - 1_000,
            reason: "processing-failed".into(),
            source: "in/0/42".into(),
            detail: "failed 3 attempts; the last one: boom".into(),
        });
        h.input_partitions = Some(2);
        let s = pod_status("pod-0", &file(h), &disk_with_task0(), &up(), NOW);
        assert_eq!(s.dead_letters, 5);
        assert_eq!(
            s.last_dead_letter.as_deref(),
            Some(
                "processing-failed at 2025-06-15T15:06:39Z (in/0/42): failed 3 attempts; the last one: boom"
            )
        );
        assert_eq!(s.input_partitions, Some(2));
        assert_eq!(
            s.message, None,
            "dead letters are counted, not a state problem"
        );
    }

    #[test]
    fn a_killed_processor_is_down_with_an_unclean_shutdown_and_its_last_known_offsets() {
        let s = pod_status("pod-0", &file(running()), &disk_with_task0(), &gone(), NOW);
        assert_eq!(s.phase.as_deref(), Some(PHASE_DOWN));
        assert!(!s.processor_up && !s.ready);
        assert_eq!(s.last_shutdown_clean, Some(false));
        assert_eq!(
            s.tasks[0].committed_offset,
            Some(120),
            "last known state from the file"
        );
        let msg = s.message.unwrap();
        assert!(
            msg.contains("not running") && msg.contains("without a drain"),
            "{msg}"
        );
    }

    #[test]
    fn a_processor_whose_process_lives_but_does_not_answer_is_not_down() {
        let probes = Probes {
            healthz: false,
            readyz: false,
            pid_alive: true,
        };
        let s = pod_status("pod-0", &file(running()), &disk_with_task0(), &probes, NOW);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert!(!s.processor_up);
        assert!(s.message.unwrap().contains("/healthz"));
    }

    #[test]
    fn a_drained_processor_that_exited_reports_a_clean_shutdown_and_the_drain_duration() {
        let mut h = running();
        h.phase = ProcessorPhase::Drained;
        h.drain_duration_ms = Some(850);
        let mut disk = disk_with_task0();
        disk.tasks.get_mut(&0).unwrap().checkpoint = Some(CheckpointFile {
            written_at_ms: NOW - 1_000,
            entries: Ok(vec![("app-dedup-changelog".into(), 0, 100)]),
        });
        let s = pod_status("pod-0", &file(h), &disk, &gone(), NOW);
        assert_eq!(s.phase.as_deref(), Some("Drained"));
        assert_eq!(s.last_shutdown_clean, Some(true));
        assert_eq!(s.drain_duration_ms, Some(850));
        assert_eq!(
            s.tasks[0].checkpoint_age_seconds,
            Some(1),
            "the drain's checkpoint file is the newest evidence"
        );
    }

    #[test]
    fn a_failed_processor_keeps_its_phase_and_says_why() {
        let mut h = running();
        h.phase = ProcessorPhase::Failed;
        h.error = Some("changelog topic app-dedup-changelog has 3 partitions, input has 6".into());
        let s = pod_status("pod-0", &file(h), &disk_with_task0(), &gone(), NOW);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.last_shutdown_clean, Some(false));
        assert!(s.message.unwrap().contains("input has 6"));
    }

    #[test]
    fn a_restart_after_a_crash_shows_the_unclean_shutdown_from_the_file() {
        let mut h = running();
        h.phase = ProcessorPhase::Starting;
        h.previous_shutdown_clean = Some(false);
        let s = pod_status(
            "pod-0",
            &file(h),
            &disk_with_task0(),
            &Probes {
                readyz: false,
                ..up()
            },
            NOW,
        );
        assert_eq!(s.phase.as_deref(), Some("Starting"));
        assert_eq!(s.last_shutdown_clean, Some(false));
    }

    #[test]
    fn restore_progress_has_a_rate_and_an_eta_while_restoring_only() {
        let mut h = running();
        h.phase = ProcessorPhase::Restoring;
        h.tasks[0].restore = Some(RestoreProgress {
            records_restored: 3_000,
            records_to_restore: 10_000,
            started_at_ms: NOW - 10_000,
            finished_at_ms: None,
        });
        let probes = Probes {
            readyz: false,
            ..up()
        };
        let s = pod_status("pod-0", &file(h.clone()), &disk_with_task0(), &probes, NOW);
        assert_eq!(
            s.tasks[0].restore,
            Some(RestoreStatus {
                restored: 3_000,
                total: 10_000,
                rate: Some(300),
                eta_seconds: Some(23)
            })
        );
        assert!(s.message.unwrap().contains("partition 0 3000/10000"));

        h.tasks[0].restore.as_mut().unwrap().finished_at_ms = Some(NOW - 1);
        let s = pod_status("pod-0", &file(h), &disk_with_task0(), &probes, NOW);
        assert_eq!(s.tasks[0].restore, None);
    }

    #[test]
    fn quarantines_on_disk_and_in_the_file_are_counted_once_and_the_newest_is_reported() {
        let mut h = running();
        h.tasks[0].opened = Some(StoreOpen::Rebuilt);
        h.tasks[0].quarantines = vec![Quarantine {
            at_ms: NOW - 30_000,
            reason: "Corruption: block checksum mismatch".into(),
            path: "/q/0-x".into(),
        }];
        let mut disk = disk_with_task0();
        disk.quarantines = vec![
            QuarantinedStore {
                path: Default::default(),
                partition: 0,
                at_ms: NOW - 90_000_000,
                reason: "an old one".into(),
            },
            QuarantinedStore {
                path: Default::default(),
                partition: 0,
                at_ms: NOW - 30_000,
                reason: "Corruption: block checksum mismatch".into(),
            },
            QuarantinedStore {
                path: Default::default(),
                partition: 1,
                at_ms: NOW - 20_000,
                reason: "another task's".into(),
            },
        ];
        let s = pod_status("pod-0", &file(h), &disk, &up(), NOW);
        assert_eq!(s.quarantines, 3);
        let t = &s.tasks[0];
        assert_eq!(t.opened.as_deref(), Some("Rebuilt"));
        assert_eq!(t.quarantines, 2);
        assert_eq!(
            t.last_quarantine_reason.as_deref(),
            Some("Corruption: block checksum mismatch")
        );
        assert_eq!(
            t.last_quarantine_at.as_deref(),
            Some("2025-06-15T15:06:10Z")
        );
        let msg = s.message.unwrap();
        assert!(
            msg.contains("partition 0 was quarantined and rebuilt"),
            "{msg}"
        );
        assert!(!msg.contains("an old one"), "history is not news: {msg}");
    }

    #[test]
    fn without_a_health_file_the_task_directories_on_disk_are_reported() {
        let s = pod_status(
            "pod-0",
            &HealthFile::Missing,
            &disk_with_task0(),
            &gone(),
            NOW,
        );
        assert_eq!(s.phase.as_deref(), Some(PHASE_DOWN));
        assert_eq!(s.last_shutdown_clean, None);
        assert_eq!(s.tasks.len(), 1);
        assert_eq!(s.tasks[0].wal_files, 2);
        assert!(s.message.unwrap().contains("no processor has run"));
    }

    #[test]
    fn a_new_volume_before_the_processor_first_started_is_starting_not_down() {
        let s = pod_status(
            "pod-0",
            &HealthFile::Missing,
            &DiskReport::default(),
            &gone(),
            NOW,
        );
        assert_eq!(s.phase.as_deref(), Some("Starting"));
        assert_eq!(s.last_shutdown_clean, None);
        assert!(s.message.unwrap().contains("no processor has run"));
    }

    #[test]
    fn a_garbled_health_file_is_a_message_not_a_crash() {
        let s = pod_status(
            "pod-0",
            &HealthFile::Unreadable("health.json: EOF".into()),
            &DiskReport::default(),
            &up(),
            NOW,
        );
        assert_eq!(s.phase.as_deref(), Some("Starting"));
        assert!(s.message.unwrap().contains("unreadable"));
    }

    #[test]
    fn an_almost_full_state_volume_is_a_reason_for_concern() {
        let mut disk = disk_with_task0();
        disk.free_bytes = Some(50);
        let s = pod_status("pod-0", &file(running()), &disk, &up(), NOW);
        assert!(s.message.unwrap().contains("almost full"));
    }

    #[test]
    fn ages_offsets_and_byte_counts_alone_are_not_a_change_worth_a_write() {
        let a = pod_status("pod-0", &file(running()), &disk_with_task0(), &up(), NOW);
        let mut h = running();
        h.tasks[0].committed_offset = Some(180);
        h.tasks[0].changelog_end_offset = Some(160);
        h.tasks[0].store_changelog_offset = Some(158);
        let mut disk = disk_with_task0();
        disk.free_bytes = Some(700);
        disk.tasks.get_mut(&0).unwrap().wal.bytes = 9000;
        let b = pod_status("pod-0", &file(h), &disk, &up(), NOW + 7_000);
        assert_ne!(a, b);
        assert_eq!(significant(&a), significant(&b));
    }

    #[test]
    fn phase_readiness_quarantines_and_big_lag_changes_are_worth_a_write() {
        let base = pod_status("pod-0", &file(running()), &disk_with_task0(), &up(), NOW);
        let not_ready = pod_status(
            "pod-0",
            &file(running()),
            &disk_with_task0(),
            &Probes {
                readyz: false,
                ..up()
            },
            NOW,
        );
        assert_ne!(significant(&base), significant(&not_ready));
        let down = pod_status("pod-0", &file(running()), &disk_with_task0(), &gone(), NOW);
        assert_ne!(significant(&base), significant(&down));
        let mut h = running();
        h.tasks[0].changelog_end_offset = Some(100_095);
        let lagging = pod_status("pod-0", &file(h), &disk_with_task0(), &up(), NOW);
        assert_ne!(significant(&base), significant(&lagging));
        let mut disk = disk_with_task0();
        disk.quarantines.push(QuarantinedStore {
            path: Default::default(),
            partition: 0,
            at_ms: NOW,
            reason: "x".into(),
        });
        let quarantined = pod_status("pod-0", &file(running()), &disk, &up(), NOW);
        assert_ne!(significant(&base), significant(&quarantined));
    }
}
