//! The StreamApp's aggregate status, computed from the spec, the StatefulSet, the agents'
//! per-pod reports and what the reconciler found (a blocked rollout, volumes growing).
//!
//! [`compute_status`] is a pure function; the reconciler writes its result with server-side
//! apply. It never returns `pods`: each agent owns its own entry there.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use streamapp_api::config::default_acceptable_recovery_lag;
use streamapp_api::crd::{PodStateStatus, StreamApp, StreamAppStatus};
use streamapp_api::status_values::{AppPhase, StateHealth, TaskState};
use streamapp_api::units::format_duration;

use crate::node_loss::NodeLossFinding;
use crate::owned;
use crate::pod_health::PodProblem;
use crate::preflight::Blocker;
use crate::storage::{STORAGE_NOT_EXPANDABLE, StorageFinding};
use crate::transaction_doctor::TransactionsFinding;

mod pod_reports;
mod state_health;

pub use pod_reports::{current_reports, report_is_stale, stale_pod_reports};
use state_health::state_healthy;
pub use state_health::{NO_REPORTS, PROCESSOR_DOWN, PROCESSOR_FAILED, REBUILDING, STORES_HEALTHY};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const STATE_HEALTHY: &str = "StateHealthy";
pub const DEGRADED: &str = "Degraded";
pub const RECONCILIATION_PAUSED: &str = "ReconciliationPaused";

/// Progressing reason while volumes grow (the event `StorageResized` follows its end).
pub const STORAGE_RESIZING: &str = "StorageResizing";
/// Degraded reason when pods that were ready are not, or never became ready in time.
pub const PODS_NOT_READY: &str = "PodsNotReady";
/// Ready, Progressing and Degraded reason when pods cannot start or be scheduled (an image
/// that does not exist, a crash loop, no node with room): waiting does not help.
pub const PODS_NOT_STARTING: &str = "PodsNotStarting";
/// Degraded reason when the kernel killed a container for exceeding its memory limit.
pub const OOM_KILLED: &str = "OOMKilled";

/// How long pods may take to become ready (restore their stores) after a change before the
/// StreamApp counts as Degraded. Restores replay only a changelog tail normally, but a rebuild
/// replays everything.
pub const PROGRESS_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// What the reconciler found besides the StatefulSet.
#[derive(Clone, Debug, Default)]
pub struct Findings {
    /// Why the current spec is not rolled out, if it is not.
    pub blocker: Option<Blocker>,
    pub storage: StorageFinding,
    /// Hash of the configuration the spec asks for (used until a StatefulSet exists).
    pub desired_config_hash: Option<String>,
    /// What the kubelet reports about the pods (see [`crate::pod_health`]).
    pub pods: Vec<PodProblem>,
    /// The `streamapp.dev/paused` annotation is set: nothing was applied.
    pub paused: bool,
    /// What the operator saw of the StreamApp's Kafka.
    pub kafka: KafkaFinding,
    /// The pods the operator runs when that is not `spec.replicas`: capped at the input's
    /// partitions, or 0 while a reset stops them.
    pub effective_replicas: Option<i32>,
    /// The reset in progress or last done (see `reset`).
    pub reset: Option<streamapp_api::crd::ResetStatus>,
    /// A scale-in waiting for the remaining pods to hold the state (see `scaling`).
    pub scale_in: Option<String>,
    /// The UID of each of the app's pods that exists, by name: a report written by another
    /// pod of the same name is stale ([`report_is_stale`]).
    pub pod_uids: BTreeMap<String, String>,
    /// What the transaction doctor last found (`None`: it has not looked since the operator
    /// started; the condition stays as it was).
    pub transactions: Option<TransactionsFinding>,
    /// What the operator decided about pods of lost nodes (`None`: it did not look; the
    /// condition stays as it was).
    pub node_loss: Option<NodeLossFinding>,
}

/// What the operator saw of a StreamApp's Kafka (see [`crate::kafka`]).
#[derive(Clone, Debug, Default)]
pub enum KafkaFinding {
    /// Not looked at this time (paused).
    #[default]
    NotChecked,
    /// The brokers did not answer, or the credentials are missing: the message says which.
    Unreachable(String),
    Seen {
        problems: Vec<crate::kafka::TopicProblem>,
        input_partitions: Option<usize>,
        lag: Option<i64>,
        lag_seconds: Option<i64>,
        /// Records in the repartition topic the dedup stage has not committed (repartitioning
        /// topologies only).
        repartition_lag: Option<i64>,
    },
}

pub const TOPICS_READY: &str = "TopicsReady";
/// Whether every repeat of an id is caught whichever input partition it arrives on.
pub const EVERY_ID_DEDUPLICATED: &str = "EveryIdDeduplicated";
pub const MISKEYED_RECORDS: &str = "MiskeyedRecords";
pub const REPLICAS_CAPPED: &str = "ReplicasCapped";
/// Progressing reason while a scale-in steps one pod at a time (see [`crate::scaling`]).
pub const SCALING_IN: &str = "ScalingIn";
pub const TOPIC_MISSING: &str = "TopicMissing";
pub const INPUT_PARTITIONS_CHANGED: &str = "InputPartitionsChanged";
pub const KAFKA_UNREACHABLE: &str = "KafkaUnreachable";

/// Counts of the StatefulSet that the status is made of.
struct Workload {
    pods: i32,
    ready: i32,
    updated: i32,
    /// A new pod template is being rolled out (or the StatefulSet controller has not caught
    /// up with the last change yet).
    rolling_out: bool,
    /// Pods are being added or removed.
    scaling: bool,
}

fn workload(sts: &StatefulSet, desired: i32) -> Workload {
    let status = sts.status.clone().unwrap_or_default();
    let seen = status.observed_generation.unwrap_or(0) >= sts.metadata.generation.unwrap_or(0);
    let revisions_differ = matches!(
        (&status.current_revision, &status.update_revision),
        (Some(current), Some(update)) if current != update
    );
    let updated = status.updated_replicas.unwrap_or(0);
    Workload {
        pods: status.replicas,
        ready: status.ready_replicas.unwrap_or(0),
        updated,
        rolling_out: desired > 0 && (!seen || revisions_differ),
        scaling: status.replicas != desired,
    }
}

/// The status the StreamApp should have now. `now` is only used for condition transition
/// times and the progress deadline, so tests pass a fixed one.
pub fn compute_status(
    app: &StreamApp,
    sts: Option<&StatefulSet>,
    findings: &Findings,
    now: Timestamp,
) -> StreamAppStatus {
    let previous = app.status.clone().unwrap_or_default();
    let generation = app.metadata.generation;
    let desired = findings.effective_replicas.unwrap_or(app.spec.replicas);
    let workload = sts.map(|s| workload(s, desired));
    let (pods, ready) = workload.as_ref().map_or((0, 0), |w| (w.pods, w.ready));
    let rolling = workload
        .as_ref()
        .is_some_and(|w| w.rolling_out || w.scaling);

    let reports = current_reports(app, &findings.pod_uids);
    let state = state_healthy(&reports, desired);

    let previous_progressing = find(&previous.conditions, PROGRESSING);
    let progressing_since = previous_progressing
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0)
        .unwrap_or(now);
    let overdue = now.duration_since(progressing_since).unsigned_abs() > PROGRESS_DEADLINE;
    // Pods that were all ready and are not any more, without a change in between: something
    // broke, it is not a rollout.
    let was_steady = previous.phase == Some(AppPhase::Running)
        || find(&previous.conditions, DEGRADED)
            .is_some_and(|c| c.status == "True" && c.reason == PODS_NOT_READY);
    let pods_lagging = desired > 0 && sts.is_some() && ready < desired && !rolling;
    let describe = |pred: fn(&PodProblem) -> bool| -> Option<String> {
        let lines: Vec<String> = findings
            .pods
            .iter()
            .filter(|p| pred(p))
            .map(PodProblem::describe)
            .collect();
        (!lines.is_empty()).then(|| lines.join("; "))
    };
    let not_starting = describe(|p| !matches!(p, PodProblem::OomKilled { .. }));
    let oom_killed = describe(|p| matches!(p, PodProblem::OomKilled { .. }));
    let topics = topics_condition(&findings.kafka);
    let topic_trouble = (topics.0 == "False").then(|| (topics.1.to_string(), topics.2.clone()));

    // Degraded, by priority.
    let degraded: Option<(String, String)> = if let Some(b) = &findings.blocker {
        Some((b.reason.to_string(), b.message.clone()))
    } else if let StorageFinding::NotExpandable(message) = &findings.storage {
        Some((STORAGE_NOT_EXPANDABLE.to_string(), message.clone()))
    } else if let Some(trouble) = &topic_trouble {
        Some(trouble.clone())
    } else if let Some(message) = &not_starting {
        Some((PODS_NOT_STARTING.to_string(), message.clone()))
    } else if let Some(message) = &oom_killed {
        Some((OOM_KILLED.to_string(), message.clone()))
    } else if state.status == "False" && matches!(state.reason, PROCESSOR_FAILED | PROCESSOR_DOWN) {
        Some((state.reason.to_string(), state.message.clone()))
    } else if pods_lagging && (was_steady || overdue) {
        Some((
            PODS_NOT_READY.to_string(),
            format!("{ready}/{desired} pods ready"),
        ))
    } else {
        None
    };

    let phase = if desired == 0 {
        AppPhase::Stopped
    } else if degraded.is_some() {
        AppPhase::Degraded
    } else if sts.is_none() {
        AppPhase::Pending
    } else if rolling || ready < desired || findings.scale_in.is_some() {
        AppPhase::Progressing
    } else {
        AppPhase::Running
    };

    let ready_condition = if desired == 0 {
        ("False", "ScaledToZero", "spec.replicas is 0".to_string())
    } else if sts.is_none() {
        let why = findings
            .blocker
            .as_ref()
            .map_or("creating the StatefulSet".to_string(), |b| {
                b.message.clone()
            });
        ("False", "NotCreated", why)
    } else if ready >= desired {
        (
            "True",
            "AllPodsReady",
            format!("{ready}/{desired} pods ready"),
        )
    } else if let Some(message) = &not_starting {
        (
            "False",
            PODS_NOT_STARTING,
            format!("{ready}/{desired} pods ready; {message}"),
        )
    } else {
        (
            "False",
            PODS_NOT_READY,
            format!("{ready}/{desired} pods ready; a pod is ready once its stores are restored"),
        )
    };

    let resizing = match &findings.storage {
        StorageFinding::Resizing(claims) => Some(claims.join(", ")),
        _ => None,
    };
    let progressing_condition = match &workload {
        _ if desired == 0 && pods > 0 => ("True", "Scaling", format!("stopping: {pods} pods left")),
        _ if desired == 0 => ("False", "ScaledToZero", "spec.replicas is 0".to_string()),
        _ if findings.blocker.is_some() => (
            "False",
            "RolloutBlocked",
            format!(
                "the current spec is not rolled out: {}",
                findings
                    .blocker
                    .as_ref()
                    .map(|b| b.message.as_str())
                    .unwrap_or("")
            ),
        ),
        None => ("True", "Creating", "creating the StatefulSet".to_string()),
        Some(_) if not_starting.is_some() => (
            "False",
            PODS_NOT_STARTING,
            not_starting.clone().unwrap_or_default(),
        ),
        Some(w) if w.rolling_out => (
            "True",
            "RollingOut",
            format!(
                "{}/{desired} pods run the current pod template",
                w.updated.min(desired)
            ),
        ),
        Some(_) if findings.scale_in.is_some() => (
            "True",
            SCALING_IN,
            findings.scale_in.clone().unwrap_or_default(),
        ),
        Some(w) if w.scaling => (
            "True",
            "Scaling",
            format!("{} pods, {desired} desired", w.pods),
        ),
        Some(_) if resizing.is_some() => (
            "True",
            STORAGE_RESIZING,
            format!(
                "expanding volume claims {}",
                resizing.clone().unwrap_or_default()
            ),
        ),
        Some(_) if ready < desired && overdue => (
            "False",
            "ProgressDeadlineExceeded",
            format!(
                "{ready}/{desired} pods ready after {}",
                format_duration(PROGRESS_DEADLINE)
            ),
        ),
        Some(_) if ready < desired => (
            "True",
            "PodsStarting",
            format!(
                "waiting for {} pods to restore their stores and become ready",
                desired - ready
            ),
        ),
        Some(_) => (
            "False",
            "RolloutComplete",
            format!("{desired} pods run the current pod template"),
        ),
    };

    let degraded_condition = match &degraded {
        Some((reason, message)) => ("True", reason.clone(), message.clone()),
        None => ("False", "AsExpected".to_string(), String::new()),
    };

    let mut conditions = vec![
        condition(
            &previous,
            READY,
            ready_condition.0,
            ready_condition.1,
            ready_condition.2,
            generation,
            now,
        ),
        condition(
            &previous,
            PROGRESSING,
            progressing_condition.0,
            progressing_condition.1,
            progressing_condition.2,
            generation,
            now,
        ),
        condition(
            &previous,
            STATE_HEALTHY,
            state.status,
            state.reason,
            state.message,
            generation,
            now,
        ),
        condition(
            &previous,
            DEGRADED,
            degraded_condition.0,
            &degraded_condition.1,
            degraded_condition.2,
            generation,
            now,
        ),
        condition(
            &previous,
            TOPICS_READY,
            topics.0,
            topics.1,
            topics.2.clone(),
            generation,
            now,
        ),
        {
            let (status, reason, message) = dedup_coverage(app, &reports);
            condition(
                &previous,
                EVERY_ID_DEDUPLICATED,
                status,
                reason,
                message,
                generation,
                now,
            )
        },
        match capped(app, findings) {
            Some(message) => condition(
                &previous,
                REPLICAS_CAPPED,
                "True",
                "MorePodsThanPartitions",
                message,
                generation,
                now,
            ),
            None => condition(
                &previous,
                REPLICAS_CAPPED,
                "False",
                "AsRequested",
                String::new(),
                generation,
                now,
            ),
        },
        if findings.paused {
            condition(
                &previous,
                RECONCILIATION_PAUSED,
                "True",
                "Paused",
                format!(
                    "the annotation {} is \"true\": spec changes, scaling and restarts wait until it is removed",
                    streamapp_api::annotations::PAUSED
                ),
                generation,
                now,
            )
        } else {
            condition(
                &previous,
                RECONCILIATION_PAUSED,
                "False",
                "Reconciling",
                String::new(),
                generation,
                now,
            )
        },
    ];

    match &findings.transactions {
        Some(found) => {
            let (status, reason, message) = transactions_condition(found);
            conditions.push(condition(
                &previous,
                TRANSACTIONS_HEALTHY,
                status,
                reason,
                message,
                generation,
                now,
            ));
        }
        None => conditions.extend(find(&previous.conditions, TRANSACTIONS_HEALTHY).cloned()),
    }
    match &findings.node_loss {
        Some(found) => {
            let (status, reason, message) = found.condition();
            conditions.push(condition(
                &previous, NODE_LOSS, status, reason, message, generation, now,
            ));
        }
        None => conditions.extend(find(&previous.conditions, NODE_LOSS).cloned()),
    }

    let tasks = || reports.iter().flat_map(|p| p.tasks.iter());
    let config_hash = sts
        .and_then(|s| crate::statefulset::config_hash(s).map(str::to_string))
        .or_else(|| findings.desired_config_hash.clone());

    let (lag, lag_seconds, input_partitions, repartition_lag) = match &findings.kafka {
        KafkaFinding::Seen {
            lag,
            lag_seconds,
            input_partitions,
            repartition_lag,
            ..
        } => (
            *lag,
            *lag_seconds,
            input_partitions.map(|p| p as i32),
            *repartition_lag,
        ),
        // Not seen this time: the last values stand (TopicsReady says why they may be stale).
        _ => (
            previous.lag,
            previous.lag_seconds,
            previous.input_partitions,
            previous.repartition_lag,
        ),
    };

    StreamAppStatus {
        observed_generation: generation,
        consumer_group: Some(crate::processor_config::application_id(app)),
        lag,
        lag_seconds,
        repartition_lag,
        input_partitions,
        reset: findings.reset.clone().or_else(|| previous.reset.clone()),
        phase: Some(phase),
        replicas: Some(pods),
        ready_replicas: Some(ready),
        ready: Some(format!("{ready}/{desired}")),
        selector: Some(owned::selector_string(app)),
        state_health: Some(match state.status {
            "True" => StateHealth::Healthy,
            "False" => StateHealth::Degraded,
            _ => StateHealth::Unknown,
        }),
        worst_restore_lag: tasks().filter_map(|t| t.restore_lag).max(),
        standby_coverage: (app.spec.standby_replicas > 0)
            .then(|| standby_coverage(&reports, input_partitions))
            .flatten(),
        oldest_checkpoint: oldest_checkpoint(&reports),
        config_hash,
        conditions,
        pods: Vec::new(),
    }
}

/// `standbyCoverage`: how many of the input's partitions have a caught-up standby copy on some
/// pod, as `covered/partitions` (unknown until the partition count is).
fn standby_coverage(reports: &[&PodStateStatus], partitions: Option<i32>) -> Option<String> {
    let partitions = partitions?;
    let covered: std::collections::BTreeSet<i32> = reports
        .iter()
        .flat_map(|r| r.tasks.iter())
        .filter(|t| t.state == Some(TaskState::Standby))
        // Caught up as the assignor counts it: within the acceptable recovery lag the operator
        // configures (the processor's default).
        .filter(|t| {
            t.restore_lag.is_some_and(|lag| {
                u64::try_from(lag).is_ok_and(|l| l <= default_acceptable_recovery_lag())
            })
        })
        .map(|t| t.partition)
        .filter(|p| (0..partitions).contains(p))
        .collect();
    Some(format!("{}/{partitions}", covered.len()))
}

/// The EveryIdDeduplicated condition: (status, reason, message). With repartitioning, or an
/// id that is the key, every repeat reaches its id's store; with `repartition: Never` that
/// holds only while the input is keyed by the id, which the pods check record by record.
fn dedup_coverage(
    app: &StreamApp,
    reports: &[&PodStateStatus],
) -> (&'static str, &'static str, String) {
    use streamapp_api::config::DedupIdSource;
    let topology = &app.spec.topology;
    if topology.dedup_id.source == DedupIdSource::Key {
        return (
            "True",
            "KeyIsTheId",
            "the dedup id is the record key: every repeat is on its id's partition".into(),
        );
    }
    if topology.repartitions() {
        return (
            "True",
            "Repartitioned",
            "records are re-keyed by their dedup id through the repartition topic before deduplication".into(),
        );
    }
    let miskeyed: Vec<String> = reports
        .iter()
        .filter(|p| p.miskeyed_records > 0)
        .map(|p| format!("{} on {}", p.miskeyed_records, p.name))
        .collect();
    if miskeyed.is_empty() {
        (
            "True",
            "InputKeyedById",
            "topology.repartition is Never and every record so far was keyed by its dedup id"
                .into(),
        )
    } else {
        (
            "False",
            MISKEYED_RECORDS,
            format!(
                "records whose key is not their dedup id ({}): with topology.repartition Never a repeat of such an id on another partition is output again; set topology.repartition to Auto",
                miskeyed.join(", ")
            ),
        )
    }
}

/// The TopicsReady condition: (status, reason, message).
fn topics_condition(kafka: &KafkaFinding) -> (&'static str, &'static str, String) {
    match kafka {
        KafkaFinding::NotChecked => (
            "Unknown",
            "NotChecked",
            "the topics were not checked".into(),
        ),
        KafkaFinding::Unreachable(why) => ("Unknown", KAFKA_UNREACHABLE, why.clone()),
        KafkaFinding::Seen { problems, .. } if problems.is_empty() => (
            "True",
            "TopicsFound",
            "every topic exists with the expected partitions".into(),
        ),
        KafkaFinding::Seen { problems, .. } => {
            let reason = if problems
                .iter()
                .any(|p| matches!(p, crate::kafka::TopicProblem::InputPartitionsChanged { .. }))
            {
                INPUT_PARTITIONS_CHANGED
            } else {
                TOPIC_MISSING
            };
            let messages: Vec<String> = problems.iter().map(|p| p.describe()).collect();
            ("False", reason, messages.join("; "))
        }
    }
}

/// Why fewer pods run than `spec.replicas` asks for, when the input's partitions cap them.
fn capped(app: &StreamApp, findings: &Findings) -> Option<String> {
    let KafkaFinding::Seen {
        input_partitions: Some(partitions),
        ..
    } = &findings.kafka
    else {
        return None;
    };
    (app.spec.replicas > *partitions as i32).then(|| {
        format!(
            "spec.replicas is {} but input topic {} has {partitions} partitions: a pod beyond that would own no \
             partition, so {partitions} pods run",
            app.spec.replicas, app.spec.topology.input_topic
        )
    })
}

/// When the store that committed least recently did: each report says how long ago, as of
/// when it was written. A time, not an age, so `kubectl get` shows a current age.
fn oldest_checkpoint(reports: &[&PodStateStatus]) -> Option<Time> {
    reports
        .iter()
        .filter_map(|p| {
            let at: Timestamp = p.reported_at.as_deref()?.parse().ok()?;
            let age = p
                .tasks
                .iter()
                .filter_map(|t| t.checkpoint_age_seconds)
                .max()?;
            at.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(age.max(0)))
                .ok()
        })
        .min()
        .map(Time)
}

/// Whether pods of the app are on nodes that are gone, and what `spec.nodeLoss` does about them
/// (see [`crate::node_loss`]).
pub const NODE_LOSS: &str = "NodeLoss";

/// No partition of the app's topics is held back by a hanging transaction (see
/// [`crate::transaction_doctor`]).
pub const TRANSACTIONS_HEALTHY: &str = "TransactionsHealthy";
pub const HANGING_TRANSACTION: &str = "HangingTransaction";

fn transactions_condition(found: &TransactionsFinding) -> (&'static str, &'static str, String) {
    match found {
        TransactionsFinding::Healthy => ("True", "NoHangingTransaction", String::new()),
        TransactionsFinding::Hanging(hanging) => (
            "False",
            HANGING_TRANSACTION,
            hanging
                .iter()
                .map(|h| {
                    format!(
                        "{}/{}: producer {} open since offset {} ({})",
                        h.topic, h.partition, h.producer_id, h.start_offset, h.detail
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
        TransactionsFinding::Unknown(why) => ("Unknown", "TransactionsUnchecked", why.clone()),
    }
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// A condition; keeps the previous transition time when its status did not change.
fn condition(
    previous: &StreamAppStatus,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let last_transition_time = find(&previous.conditions, type_)
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        // The API server keeps whole seconds; so does the comparison with what it returns.
        .unwrap_or_else(|| Time(Timestamp::from_second(now.as_second()).expect("a valid time")));
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// Whether `status` differs from what the StreamApp has, ignoring the agents' `pods`: only then
/// is it written (no write, no watch event, no reconcile storm).
pub fn needs_update(app: &StreamApp, status: &StreamAppStatus) -> bool {
    let mut current = app.status.clone().unwrap_or_default();
    current.pods.clear();
    let mut new = status.clone();
    new.pods.clear();
    current != new
}

/// A condition of a status, by type.
pub fn condition_of<'a>(status: &'a StreamAppStatus, type_: &str) -> Option<&'a Condition> {
    find(&status.conditions, type_)
}

#[cfg(test)]
mod tests;
