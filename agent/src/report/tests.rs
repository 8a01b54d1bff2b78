//! Unit tests of the pod status entry.

use super::*;
use streamapp_api::health::{
    DeadLetterNote, Quarantine, RestoreProgress, StoreBackoff, StoreOpen, StoreUnavailable,
    TaskState, WalFiles,
};
use streamapp_api::state_volume::WalOnDisk;
use streamapp_api::state_volume::checkpoint::{CheckpointEntry, CheckpointFile};
use streamapp_api::status_values;

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
    assert_eq!(s.phase, Some(PodPhase::Running));
    assert!(s.processor_up && s.ready);
    assert_eq!(s.last_shutdown_clean, Some(true));
    assert_eq!(s.free_disk_bytes, Some(800));
    assert_eq!(s.message, None, "healthy: no message");
    assert_eq!(s.reported_at.as_deref(), Some("2025-06-15T15:06:40Z"));
    assert_eq!(
        s.tasks,
        vec![TaskStateStatus {
            partition: 0,
            state: Some(status_values::TaskState::Active),
            backoff: None,
            backoff_since: None,
            committed_offset: Some(120),
            changelog_end: Some(100),
            restore_lag: Some(5),
            restore: None,
            input_waiting_for_transaction_at: None,
            opened: Some(status_values::StoreOpen::Clean),
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
    assert_eq!(t.state, Some(status_values::TaskState::BackingOff));
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
    assert_eq!(s.phase, Some(PodPhase::Down));
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
    assert_eq!(s.phase, Some(PodPhase::Running));
    assert!(!s.processor_up);
    assert!(s.message.unwrap().contains("/healthz"));
}

#[test]
fn a_drained_processor_that_exited_reports_a_clean_shutdown_and_the_drain_duration() {
    let mut h = running();
    h.phase = ProcessorPhase::Drained;
    h.drain_duration_ms = Some(850);
    h.drain_requested_by = Some(streamapp_api::health::DrainRequest::Http);
    let mut disk = disk_with_task0();
    disk.tasks.get_mut(&0).unwrap().checkpoint = Some(CheckpointFile {
        written_at_ms: NOW - 1_000,
        entries: Ok(vec![CheckpointEntry {
            topic: "app-dedup-changelog".into(),
            partition: 0,
            offset: 100,
        }]),
    });
    let s = pod_status("pod-0", &file(h), &disk, &gone(), NOW);
    assert_eq!(s.phase, Some(PodPhase::Drained));
    assert_eq!(s.last_shutdown_clean, Some(true));
    assert_eq!(s.drain_duration_ms, Some(850));
    assert_eq!(
        s.drain_requested_by,
        Some(status_values::DrainRequest::Http)
    );
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
    assert_eq!(s.phase, Some(PodPhase::Failed));
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
    assert_eq!(s.phase, Some(PodPhase::Starting));
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
        waiting_for_transaction_at: None,
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
            eta_seconds: Some(23),
            waiting_for_transaction_at: None,
        })
    );
    assert!(s.message.unwrap().contains("partition 0 3000/10000"));

    // Held back by an open transaction on the changelog: the status says where.
    h.tasks[0]
        .restore
        .as_mut()
        .unwrap()
        .waiting_for_transaction_at = Some(3_000);
    let s = pod_status("pod-0", &file(h.clone()), &disk_with_task0(), &probes, NOW);
    assert_eq!(
        s.tasks[0]
            .restore
            .as_ref()
            .unwrap()
            .waiting_for_transaction_at,
        Some(3_000)
    );
    assert!(s.message.unwrap().contains(
        "partition 0 3000/10000 (waiting for an open transaction at offset 3000 to end)"
    ));

    h.tasks[0].restore.as_mut().unwrap().finished_at_ms = Some(NOW - 1);
    let s = pod_status("pod-0", &file(h), &disk_with_task0(), &probes, NOW);
    assert_eq!(s.tasks[0].restore, None);
}

#[test]
fn an_input_held_back_by_an_open_transaction_is_in_the_task_and_the_message_while_the_processor_lives()
 {
    let mut h = running();
    h.tasks[0].input_waiting_for_transaction_at = Some(4_200);
    let s = pod_status("pod-0", &file(h.clone()), &disk_with_task0(), &up(), NOW);
    assert_eq!(s.tasks[0].input_waiting_for_transaction_at, Some(4_200));
    assert_eq!(
        s.message.as_deref(),
        Some(
            "partition 0 reads nothing past offset 4200 of its input: a transaction open there \
             has not ended"
        )
    );

    // A processor that is gone waits for nothing: its last report is history.
    let s = pod_status("pod-0", &file(h), &disk_with_task0(), &gone(), NOW);
    assert_eq!(s.tasks[0].input_waiting_for_transaction_at, None);
    assert!(!s.message.unwrap_or_default().contains("reads nothing past"));
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
    assert_eq!(t.opened, Some(status_values::StoreOpen::Rebuilt));
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
    assert_eq!(s.phase, Some(PodPhase::Down));
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
    assert_eq!(s.phase, Some(PodPhase::Starting));
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
    assert_eq!(s.phase, Some(PodPhase::Starting));
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
