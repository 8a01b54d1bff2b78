//! Unit tests of the status: objects in, status out.

use super::*;
use crate::preflight::{Blocker, MEMORY_BUDGET_EXCEEDED};
use crate::testing::app;
use streamapp_api::crd::{RestoreStatus, TaskStateStatus};
use streamapp_api::status_values::{PodPhase, StoreOpen};

fn now() -> Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

fn later(secs: i64) -> Timestamp {
    now() + k8s_openapi::jiff::SignedDuration::from_secs(secs)
}

/// A StatefulSet as the controller reports it; `rev` differs between current and update while
/// a rollout runs.
fn sts(pods: i32, ready: i32, updated: i32, current_rev: &str, update_rev: &str) -> StatefulSet {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "orders", "generation": 2 },
        "spec": {
            "selector": { "matchLabels": { "streamapp.dev/app": "orders" } },
            "template": { "metadata": { "annotations": { "streamapp.dev/config-hash": "abc" } } },
        },
        "status": {
            "observedGeneration": 2, "replicas": pods, "readyReplicas": ready, "updatedReplicas": updated,
            "currentRevision": current_rev, "updateRevision": update_rev,
        },
    }))
    .unwrap()
}

fn steady(ready: i32) -> StatefulSet {
    sts(3, ready, 3, "r1", "r1")
}

fn status_of(
    app: &StreamApp,
    sts: Option<&StatefulSet>,
    findings: &Findings,
    at: Timestamp,
) -> StreamAppStatus {
    compute_status(app, sts, findings, at)
}

fn cond<'a>(status: &'a StreamAppStatus, type_: &str) -> &'a Condition {
    condition_of(status, type_).unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
}

fn with_status(mut app: StreamApp, status: StreamAppStatus) -> StreamApp {
    app.status = Some(status);
    app
}

fn report(name: &str, phase: PodPhase, tasks: Vec<TaskStateStatus>) -> PodStateStatus {
    PodStateStatus {
        name: name.into(),
        phase: Some(phase),
        processor_up: true,
        ready: true,
        tasks,
        ..Default::default()
    }
}

#[test]
fn all_pods_ready_after_the_rollout_is_running_and_ready() {
    let status = status_of(&app(), Some(&steady(3)), &Findings::default(), now());
    assert_eq!(status.phase, Some(AppPhase::Running));
    assert_eq!(status.ready.as_deref(), Some("3/3"));
    assert_eq!((status.replicas, status.ready_replicas), (Some(3), Some(3)));
    assert_eq!(status.observed_generation, Some(4));
    assert_eq!(status.selector.as_deref(), Some("streamapp.dev/app=orders"));
    assert_eq!(status.config_hash.as_deref(), Some("abc"));
    let ready = cond(&status, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "AllPodsReady")
    );
    assert_eq!(ready.observed_generation, Some(4));
    assert_eq!(cond(&status, "Progressing").reason, "RolloutComplete");
    assert_eq!(cond(&status, "Degraded").status, "False");
    assert!(status.pods.is_empty(), "the operator never writes pods");
}

#[test]
fn scaled_to_zero_is_stopped() {
    let mut app = app();
    app.spec.replicas = 0;
    let status = status_of(
        &app,
        Some(&sts(0, 0, 0, "r1", "r1")),
        &Findings::default(),
        now(),
    );
    assert_eq!(status.phase, Some(AppPhase::Stopped));
    assert_eq!(status.ready.as_deref(), Some("0/0"));
    assert_eq!(cond(&status, "Ready").reason, "ScaledToZero");
    assert_eq!(cond(&status, "Progressing").status, "False");
}

#[test]
fn pods_not_yet_ready_the_first_time_are_progressing_not_degraded() {
    let status = status_of(&app(), Some(&steady(1)), &Findings::default(), now());
    assert_eq!(status.phase, Some(AppPhase::Progressing));
    assert_eq!(cond(&status, "Ready").status, "False");
    assert_eq!(cond(&status, "Progressing").reason, "PodsStarting");
    assert_eq!(cond(&status, "Degraded").status, "False");
}

#[test]
fn pods_still_not_ready_after_the_progress_deadline_are_degraded() {
    let first = status_of(&app(), Some(&steady(1)), &Findings::default(), now());
    let app = with_status(app(), first);
    let status = status_of(&app, Some(&steady(1)), &Findings::default(), later(31 * 60));
    assert_eq!(status.phase, Some(AppPhase::Degraded));
    assert_eq!(
        cond(&status, "Progressing").reason,
        "ProgressDeadlineExceeded"
    );
    assert_eq!(cond(&status, "Degraded").reason, "PodsNotReady");
}

#[test]
fn a_new_pod_template_rolling_out_is_progressing() {
    let running = with_status(
        app(),
        status_of(&app(), Some(&steady(3)), &Findings::default(), now()),
    );
    let status = status_of(
        &running,
        Some(&sts(3, 2, 1, "r1", "r2")),
        &Findings::default(),
        later(5),
    );
    assert_eq!(status.phase, Some(AppPhase::Progressing));
    let progressing = cond(&status, "Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "RollingOut")
    );
    assert_eq!(progressing.message, "1/3 pods run the current pod template");
    assert_eq!(
        cond(&status, "Degraded").status,
        "False",
        "a rollout is not a failure"
    );
}

#[test]
fn ready_pods_that_stop_being_ready_make_a_running_app_degraded() {
    let running = with_status(
        app(),
        status_of(&app(), Some(&steady(3)), &Findings::default(), now()),
    );
    let status = status_of(&running, Some(&steady(2)), &Findings::default(), later(5));
    assert_eq!(status.phase, Some(AppPhase::Degraded));
    let degraded = cond(&status, "Degraded");
    assert_eq!(
        (degraded.reason.as_str(), degraded.message.as_str()),
        ("PodsNotReady", "2/3 pods ready")
    );
    // And it recovers.
    let degraded_app = with_status(app(), status);
    let recovered = status_of(
        &degraded_app,
        Some(&steady(3)),
        &Findings::default(),
        later(10),
    );
    assert_eq!(recovered.phase, Some(AppPhase::Running));
    assert_eq!(cond(&recovered, "Degraded").status, "False");
}

#[test]
fn a_blocked_rollout_is_degraded_with_the_blockers_reason() {
    let findings = Findings {
        blocker: Some(Blocker {
            reason: MEMORY_BUDGET_EXCEEDED,
            message: "needs 370 MiB, limit 256Mi".into(),
        }),
        ..Default::default()
    };
    let status = status_of(&app(), Some(&steady(3)), &findings, now());
    assert_eq!(status.phase, Some(AppPhase::Degraded));
    let degraded = cond(&status, "Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "MemoryBudgetExceeded")
    );
    assert_eq!(degraded.message, "needs 370 MiB, limit 256Mi");
    assert_eq!(cond(&status, "Progressing").reason, "RolloutBlocked");
    assert_eq!(
        cond(&status, "Ready").status,
        "True",
        "the pods still serve the previous configuration"
    );

    let never_created = status_of(&app(), None, &findings, now());
    assert_eq!(cond(&never_created, "Ready").reason, "NotCreated");
    assert_eq!(never_created.replicas, Some(0));
}

#[test]
fn growing_volumes_are_progressing_and_a_fixed_size_class_is_degraded() {
    let resizing = Findings {
        storage: StorageFinding::Resizing(vec!["state-orders-0".into()]),
        ..Default::default()
    };
    let status = status_of(&app(), Some(&steady(3)), &resizing, now());
    let progressing = cond(&status, "Progressing");
    assert_eq!(
        (progressing.reason.as_str(), progressing.message.as_str()),
        ("StorageResizing", "expanding volume claims state-orders-0")
    );
    assert_eq!(
        status.phase,
        Some(AppPhase::Running),
        "pods are fine while volumes grow"
    );

    let fixed = Findings {
        storage: StorageFinding::NotExpandable("claims state-orders-0 cannot grow".into()),
        ..Default::default()
    };
    let status = status_of(&app(), Some(&steady(3)), &fixed, now());
    assert_eq!(cond(&status, "Degraded").reason, "StorageNotExpandable");
    assert_eq!(status.phase, Some(AppPhase::Degraded));
}

#[test]
fn state_health_is_unknown_until_an_agent_reports() {
    let status = status_of(&app(), Some(&steady(3)), &Findings::default(), now());
    let state = cond(&status, "StateHealthy");
    assert_eq!(
        (state.status.as_str(), state.reason.as_str()),
        ("Unknown", "NoReports")
    );
    assert_eq!(status.state_health, Some(StateHealth::Unknown));
    assert_eq!(status.worst_restore_lag, None);
}

#[test]
fn healthy_reports_give_the_worst_lag_and_the_oldest_checkpoint() {
    let task = |partition, lag, age| TaskStateStatus {
        partition,
        restore_lag: Some(lag),
        checkpoint_age_seconds: Some(age),
        opened: Some(StoreOpen::Clean),
        ..Default::default()
    };
    let app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![
                PodStateStatus {
                    reported_at: Some("2026-01-01T11:59:50Z".into()),
                    ..report(
                        "orders-0",
                        PodPhase::Running,
                        vec![task(0, 12, 3), task(1, 40, 130)],
                    )
                },
                PodStateStatus {
                    reported_at: Some("2026-01-01T11:59:59Z".into()),
                    ..report("orders-1", PodPhase::Running, vec![task(2, 7, 1)])
                },
            ],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    assert_eq!(status.worst_restore_lag, Some(40));
    // orders-0 reported at 11:59:50 that partition 1 last committed 130 s before.
    assert_eq!(
        status.oldest_checkpoint,
        Some(Time("2026-01-01T11:57:40Z".parse().unwrap()))
    );
    assert_eq!(status.state_health, Some(StateHealth::Healthy));
    let state = cond(&status, "StateHealthy");
    assert_eq!(
        (state.status.as_str(), state.reason.as_str()),
        ("True", "StoresHealthy")
    );
}

#[test]
fn a_failed_processor_makes_state_unhealthy_and_the_app_degraded() {
    let mut failed = report("orders-2", PodPhase::Failed, vec![]);
    failed.message = Some("store open failed".into());
    let app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![report("orders-0", PodPhase::Running, vec![]), failed],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    let state = cond(&status, "StateHealthy");
    assert_eq!(
        (state.status.as_str(), state.reason.as_str()),
        ("False", "ProcessorFailed")
    );
    assert!(
        state.message.contains("orders-2: store open failed"),
        "{}",
        state.message
    );
    assert_eq!(status.state_health, Some(StateHealth::Degraded));
    assert_eq!(cond(&status, "Degraded").reason, "ProcessorFailed");
    assert_eq!(status.phase, Some(AppPhase::Degraded));
}

#[test]
fn a_down_processor_is_reported_as_down() {
    let app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![report("orders-1", PodPhase::Down, vec![])],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    assert_eq!(cond(&status, "StateHealthy").reason, "ProcessorDown");
}

#[test]
fn a_store_rebuilt_after_quarantine_names_the_pod_partition_and_reason() {
    let rebuilding = TaskStateStatus {
        partition: 4,
        opened: Some(StoreOpen::Rebuilt),
        restore: Some(RestoreStatus {
            restored: 100,
            total: 5000,
            rate: None,
            eta_seconds: None,
            waiting_for_transaction_at: None,
        }),
        last_quarantine_reason: Some("Corruption: block checksum mismatch".into()),
        ..Default::default()
    };
    let app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![report("orders-1", PodPhase::Restoring, vec![rebuilding])],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    let state = cond(&status, "StateHealthy");
    assert_eq!(
        (state.status.as_str(), state.reason.as_str()),
        ("False", "Rebuilding")
    );
    assert_eq!(
        state.message,
        "pod orders-1 is rebuilding partition 4 from the changelog after quarantining its store: \
         Corruption: block checksum mismatch (100 of 5000 records restored)"
    );
    assert_eq!(
        cond(&status, "Degraded").status,
        "False",
        "a rebuild heals itself"
    );
}

#[test]
fn a_finished_rebuild_is_healthy_again() {
    let rebuilt = TaskStateStatus {
        partition: 4,
        opened: Some(StoreOpen::Rebuilt),
        restore: None,
        ..Default::default()
    };
    let app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![report("orders-1", PodPhase::Running, vec![rebuilt])],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    assert_eq!(cond(&status, "StateHealthy").reason, "StoresHealthy");
}

#[test]
fn a_store_backing_off_makes_state_unhealthy_and_an_idle_replica_is_said_in_words() {
    let backing_off = TaskStateStatus {
        partition: 2,
        backoff: Some("DiskFull: No space left on device".into()),
        ..Default::default()
    };
    let app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![report("orders-1", PodPhase::Running, vec![backing_off])],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    let c = cond(&status, "StateHealthy");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "StoreBackingOff")
    );
    assert!(c.message.contains("partition 2"), "{}", c.message);

    let mut idle = report("orders-2", PodPhase::Running, vec![]);
    idle.input_partitions = Some(2);
    let app = with_status(
        app_with_replicas(3),
        StreamAppStatus {
            pods: vec![idle],
            ..Default::default()
        },
    );
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    let c = cond(&status, "StateHealthy");
    assert_eq!(c.reason, "StoresHealthy");
    assert!(
        c.message
            .contains("input topic has 2 partitions: 1 pods own no partition"),
        "{}",
        c.message
    );
}

fn app_with_replicas(replicas: i32) -> StreamApp {
    let mut a = app();
    a.spec.replicas = replicas;
    a
}

#[test]
fn reports_of_scaled_away_pods_no_longer_count() {
    let mut app = with_status(
        app(),
        StreamAppStatus {
            pods: vec![
                report("orders-0", PodPhase::Running, vec![]),
                report("orders-5", PodPhase::Failed, vec![]),
                report("other-0", PodPhase::Failed, vec![]),
            ],
            ..Default::default()
        },
    );
    app.spec.replicas = 3;
    let status = status_of(&app, Some(&steady(3)), &Findings::default(), now());
    assert_eq!(cond(&status, "StateHealthy").reason, "StoresHealthy");
}

#[test]
fn transition_time_is_kept_while_a_condition_keeps_its_status() {
    let first = status_of(&app(), Some(&steady(3)), &Findings::default(), now());
    let app = with_status(app(), first.clone());
    let again = status_of(&app, Some(&steady(3)), &Findings::default(), later(600));
    assert_eq!(
        cond(&again, "Ready").last_transition_time,
        cond(&first, "Ready").last_transition_time
    );
    assert!(
        !needs_update(&app, &again),
        "nothing changed, nothing to write"
    );

    let dropped = status_of(&app, Some(&steady(2)), &Findings::default(), later(600));
    assert_eq!(cond(&dropped, "Ready").last_transition_time.0, later(600));
    assert!(needs_update(&app, &dropped));
}

#[test]
fn agents_entries_alone_never_cause_a_status_write() {
    let computed = status_of(&app(), Some(&steady(3)), &Findings::default(), now());
    let mut current = computed.clone();
    current.pods = vec![report("orders-0", PodPhase::Running, vec![])];
    assert!(!needs_update(&with_status(app(), current), &computed));
}

#[test]
fn pods_that_cannot_start_say_why_in_every_condition_instead_of_progressing_forever() {
    let findings = Findings {
        pods: vec![crate::pod_health::PodProblem::NotStarting {
            pod: "orders-2".into(),
            container: "processor".into(),
            reason: "ErrImageNeverPull".into(),
            message: "Container image \"x\" is not present with pull policy of Never".into(),
        }],
        ..Default::default()
    };
    let status = status_of(&app(), Some(&steady(2)), &findings, now());
    for type_ in ["Ready", "Progressing", "Degraded"] {
        let c = cond(&status, type_);
        assert_eq!(c.reason, PODS_NOT_STARTING, "{type_}: {c:?}");
        assert!(
            c.message
                .contains("orders-2: container processor is ErrImageNeverPull"),
            "{c:?}"
        );
    }
    assert_eq!(cond(&status, "Ready").status, "False");
    assert_eq!(cond(&status, "Progressing").status, "False");
    assert_eq!(cond(&status, "Degraded").status, "True");
    assert_eq!(status.phase, Some(AppPhase::Degraded));
}

#[test]
fn an_oom_killed_container_makes_the_streamapp_degraded_even_when_all_pods_are_ready() {
    let findings = Findings {
        pods: vec![crate::pod_health::PodProblem::OomKilled {
            pod: "orders-0".into(),
            container: "processor".into(),
            restarts: 1,
        }],
        ..Default::default()
    };
    let status = status_of(&app(), Some(&steady(3)), &findings, now());
    let degraded = cond(&status, "Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", OOM_KILLED)
    );
    assert!(
        degraded
            .message
            .contains("orders-0: container processor was OOMKilled"),
        "{degraded:?}"
    );
    assert_eq!(
        cond(&status, "Ready").status,
        "True",
        "the pods are ready again"
    );
}

#[test]
fn reports_of_pods_scaled_away_are_stale_once_the_pods_are_gone() {
    let mut app = app();
    app.spec.replicas = 2;
    let app = with_status(
        app,
        StreamAppStatus {
            pods: ["orders-0", "orders-1", "orders-2", "orders-3", "other-0"]
                .into_iter()
                .map(|n| report(n, PodPhase::Running, vec![]))
                .collect(),
            ..Default::default()
        },
    );
    // orders-3 is still shutting down; orders-2 and other-0 are gone.
    let existing = uids(&[("orders-0", "u0"), ("orders-1", "u1"), ("orders-3", "u3")]);
    assert_eq!(
        stale_pod_reports(&app, &existing),
        [
            (2, "orders-2".to_string(), None),
            (4, "other-0".to_string(), None)
        ]
    );
}

fn uids(pods: &[(&str, &str)]) -> BTreeMap<String, String> {
    pods.iter()
        .map(|(name, uid)| (name.to_string(), uid.to_string()))
        .collect()
}

#[test]
fn a_report_written_by_an_older_pod_of_the_same_name_is_stale_never_counted_and_removed() {
    let mut app = app();
    app.spec.replicas = 2;
    let written_by = |name: &str, uid: Option<&str>, ready: bool| PodStateStatus {
        uid: uid.map(String::from),
        ready,
        ..report(name, PodPhase::Running, vec![])
    };
    let app = with_status(
        app,
        StreamAppStatus {
            pods: vec![
                // The old orders-0, on a node that came back, writing over its replacement's.
                written_by("orders-0", Some("old"), true),
                written_by("orders-1", Some("u1"), false),
            ],
            ..Default::default()
        },
    );
    let live = uids(&[("orders-0", "new"), ("orders-1", "u1")]);
    assert!(report_is_stale(
        &app.status.as_ref().unwrap().pods[0],
        &live
    ));
    assert_eq!(
        stale_pod_reports(&app, &live),
        [(0, "orders-0".to_string(), Some("old".to_string()))]
    );
    let current: Vec<&str> = current_reports(&app, &live)
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(current, ["orders-1"], "the stale report does not count");
    // An agent that reports no UID (an older agent) is taken as it is.
    let unknown = with_status(
        app.clone(),
        StreamAppStatus {
            pods: vec![written_by("orders-0", None, true)],
            ..Default::default()
        },
    );
    assert!(stale_pod_reports(&unknown, &live).is_empty());
}

#[test]
fn a_scale_in_waiting_for_the_remaining_pods_is_progressing_with_what_it_waits_for() {
    let findings = Findings {
        effective_replicas: Some(3),
        scale_in: Some("scaling in from 3 to 1 pods one at a time: waiting for orders-0 partition 2 to restore".into()),
        ..Default::default()
    };
    let status = status_of(&app(), Some(&steady(3)), &findings, now());
    assert_eq!(status.phase, Some(AppPhase::Progressing));
    let progressing = cond(&status, "Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "ScalingIn")
    );
    assert!(
        progressing
            .message
            .ends_with("orders-0 partition 2 to restore")
    );
    assert_eq!(cond(&status, "Degraded").status, "False");
}

#[test]
fn every_id_is_deduplicated_when_repartitioning_and_a_miskeyed_input_under_never_says_so() {
    use streamapp_api::config::{DedupId, DedupIdSource, Repartition};
    let condition_for = |source: DedupIdSource, repartition: Repartition, miskeyed: i64| {
        let mut app = app();
        app.spec.topology.dedup_id = DedupId {
            source,
            header: Some("cmd-id".into()),
            json_pointer: None,
        };
        app.spec.topology.repartition = repartition;
        let mut pod = report("orders-1", PodPhase::Running, vec![]);
        pod.miskeyed_records = miskeyed;
        let app = with_status(
            app,
            StreamAppStatus {
                pods: vec![pod],
                ..Default::default()
            },
        );
        cond(
            &status_of(&app, Some(&steady(3)), &Findings::default(), now()),
            EVERY_ID_DEDUPLICATED,
        )
        .clone()
    };
    let keyed = condition_for(DedupIdSource::Key, Repartition::Never, 0);
    assert_eq!(
        (keyed.status.as_str(), keyed.reason.as_str()),
        ("True", "KeyIsTheId")
    );
    let auto = condition_for(DedupIdSource::Header, Repartition::Auto, 0);
    assert_eq!(
        (auto.status.as_str(), auto.reason.as_str()),
        ("True", "Repartitioned")
    );
    let trusted = condition_for(DedupIdSource::Header, Repartition::Never, 0);
    assert_eq!(
        (trusted.status.as_str(), trusted.reason.as_str()),
        ("True", "InputKeyedById")
    );
    let miskeyed = condition_for(DedupIdSource::Header, Repartition::Never, 7);
    assert_eq!(
        (miskeyed.status.as_str(), miskeyed.reason.as_str()),
        ("False", MISKEYED_RECORDS)
    );
    assert!(
        miskeyed.message.contains("7 on orders-1")
            && miskeyed.message.contains("topology.repartition to Auto"),
        "{}",
        miskeyed.message
    );
}

#[test]
fn standby_coverage_counts_partitions_with_a_caught_up_standby_copy() {
    let task = |partition, state: TaskState, lag| TaskStateStatus {
        partition,
        state: Some(state),
        restore_lag: Some(lag),
        ..Default::default()
    };
    let a = report(
        "orders-0",
        PodPhase::Running,
        vec![
            task(0, TaskState::Active, 0),
            task(1, TaskState::Standby, 5),
            task(2, TaskState::Standby, 50_000),
        ],
    );
    let b = report(
        "orders-1",
        PodPhase::Running,
        vec![
            task(1, TaskState::Active, 0),
            task(2, TaskState::Active, 0),
            task(0, TaskState::WarmingUp, 0),
        ],
    );
    // Partition 1 is covered; 2's copy is far behind; 0 has only a warm-up (a move, not a
    // copy kept beside its active task); 3 has nothing.
    assert_eq!(standby_coverage(&[&a, &b], Some(4)).as_deref(), Some("1/4"));
    assert_eq!(
        standby_coverage(&[&a, &b], None),
        None,
        "partitions unknown"
    );
    assert_eq!(standby_coverage(&[], Some(4)).as_deref(), Some("0/4"));
}

#[test]
fn a_hanging_transaction_is_a_condition_naming_the_partition_and_it_outlives_an_unlooked_reconcile()
{
    use crate::transaction_doctor::{HangingTransaction, TransactionsFinding};
    let hanging = Findings {
        transactions: Some(TransactionsFinding::Hanging(vec![HangingTransaction {
            topic: "orders-changelog".into(),
            partition: 3,
            producer_id: 42,
            start_offset: 1000,
            detail: "its coordinator has no transaction in progress (Empty); not ended: spec.kafka.abortHangingTransactions is Never".into(),
        }])),
        ..Findings::default()
    };
    let status = status_of(&app(), Some(&steady(3)), &hanging, now());
    let c = cond(&status, "TransactionsHealthy").clone();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "HangingTransaction")
    );
    assert_eq!(
        c.message,
        "orders-changelog/3: producer 42 open since offset 1000 (its coordinator has no \
         transaction in progress (Empty); not ended: spec.kafka.abortHangingTransactions is Never)"
    );
    // A reconcile before the doctor's first look (the operator restarted) keeps the condition.
    let reported = with_status(app(), status.clone());
    let again = status_of(&reported, Some(&steady(3)), &Findings::default(), later(5));
    assert_eq!(cond(&again, "TransactionsHealthy"), &c);
    let healthy = Findings {
        transactions: Some(TransactionsFinding::Healthy),
        ..Findings::default()
    };
    let fixed = status_of(&reported, Some(&steady(3)), &healthy, later(10));
    let c = cond(&fixed, "TransactionsHealthy");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NoHangingTransaction")
    );
    let unknown = Findings {
        transactions: Some(TransactionsFinding::Unknown("the broker is away".into())),
        ..Findings::default()
    };
    let c = cond(
        &status_of(&reported, Some(&steady(3)), &unknown, later(10)),
        "TransactionsHealthy",
    )
    .clone();
    assert_eq!(
        (c.status.as_str(), c.message.as_str()),
        ("Unknown", "the broker is away")
    );
    let first = status_of(&app(), Some(&steady(3)), &Findings::default(), now());
    assert!(
        first
            .conditions
            .iter()
            .all(|c| c.type_ != "TransactionsHealthy"),
        "no condition before the first look"
    );
}
