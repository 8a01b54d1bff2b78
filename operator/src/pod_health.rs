//! What the kubelet says about a StreamApp's pods that the StatefulSet's counts do not: a pod
//! whose containers cannot start (no such image, a bad configuration reference, a crash loop),
//! a pod the scheduler cannot place, and a container the kernel killed for exceeding its
//! memory limit.
//!
//! [`pod_problems`] is a pure function of the pods; the status turns its findings into
//! conditions, so `kubectl get streamapps` says why pods do not become ready instead of
//! "Progressing" forever.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// Waiting reasons of a container that will not start by itself: each needs a change (an
/// image, a Secret, a fix) rather than patience.
const STUCK_WAITING: &[&str] = &[
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// How long an OOM kill keeps the StreamApp Degraded after the container restarted.
pub const RECENT_OOM_KILL: Duration = Duration::from_secs(15 * 60);

/// Why a pod is not doing its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodProblem {
    /// A container is waiting for a reason that does not go away by itself.
    NotStarting {
        pod: String,
        container: String,
        reason: String,
        message: String,
    },
    /// The scheduler found no node for the pod.
    Unschedulable { pod: String, message: String },
    /// The kernel killed a container for exceeding its memory limit (recently, or it has
    /// not come back yet).
    OomKilled {
        pod: String,
        container: String,
        restarts: i32,
    },
}

impl PodProblem {
    /// One line for a condition message.
    pub fn describe(&self) -> String {
        match self {
            PodProblem::NotStarting {
                pod,
                container,
                reason,
                message,
            } if message.is_empty() => format!("pod {pod}: container {container} is {reason}"),
            PodProblem::NotStarting {
                pod,
                container,
                reason,
                message,
            } => format!("pod {pod}: container {container} is {reason}: {message}"),
            PodProblem::Unschedulable { pod, message } => {
                format!("pod {pod} cannot be scheduled: {message}")
            }
            PodProblem::OomKilled {
                pod,
                container,
                restarts,
            } => format!(
                "pod {pod}: container {container} was OOMKilled (it exceeded its memory limit; {restarts} restarts)"
            ),
        }
    }
}

/// The problems of `pods`, in pod name order. `now` dates OOM kills.
pub fn pod_problems(pods: &[Pod], now: Timestamp) -> Vec<PodProblem> {
    let mut pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.name_any());
    let mut problems = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        let Some(status) = &pod.status else { continue };
        if let Some(c) = status.conditions.iter().flatten().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        }) {
            problems.push(PodProblem::Unschedulable {
                pod: name.clone(),
                message: c.message.clone().unwrap_or_default(),
            });
            continue;
        }
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for c in containers {
            if let Some(problem) = container_problem(&name, c, now) {
                problems.push(problem);
            }
        }
    }
    problems
}

fn container_problem(pod: &str, c: &ContainerStatus, now: Timestamp) -> Option<PodProblem> {
    let state = c.state.as_ref();
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let terminated_now = state.and_then(|s| s.terminated.as_ref());
    // An OOM kill shows as the current state until the restart, then as the last state.
    let oom = terminated_now
        .filter(|t| t.reason.as_deref() == Some("OOMKilled"))
        .map(|_| true)
        .or_else(|| {
            last.filter(|t| t.reason.as_deref() == Some("OOMKilled"))
                .map(|t| {
                    let running = state.is_some_and(|s| s.running.is_some());
                    let recent = t
                        .finished_at
                        .as_ref()
                        .is_none_or(|at| now.duration_since(at.0).unsigned_abs() < RECENT_OOM_KILL);
                    !running || recent
                })
        })
        .unwrap_or(false);
    if oom {
        return Some(PodProblem::OomKilled {
            pod: pod.to_string(),
            container: c.name.clone(),
            restarts: c.restart_count,
        });
    }
    let waiting = state?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    STUCK_WAITING
        .contains(&reason)
        .then(|| PodProblem::NotStarting {
            pod: pod.to_string(),
            container: c.name.clone(),
            reason: reason.to_string(),
            message: waiting.message.clone().unwrap_or_default(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "dedup-0" },
            "status": status,
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_missing_image_is_a_pod_that_is_not_starting() {
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": "processor", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "waiting": { "reason": "ErrImageNeverPull",
                    "message": "Container image \"x\" is not present with pull policy of Never" } },
            }],
        }));
        let problems = pod_problems(&[p], now());
        assert_eq!(
            problems,
            [PodProblem::NotStarting {
                pod: "dedup-0".into(),
                container: "processor".into(),
                reason: "ErrImageNeverPull".into(),
                message: "Container image \"x\" is not present with pull policy of Never".into(),
            }]
        );
        assert_eq!(
            problems[0].describe(),
            "pod dedup-0: container processor is ErrImageNeverPull: Container image \"x\" is not present with pull policy of Never"
        );
    }

    #[test]
    fn a_container_that_is_only_creating_is_no_problem() {
        let p = pod(serde_json::json!({
            "containerStatuses": [{
                "name": "processor", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "waiting": { "reason": "ContainerCreating" } },
            }],
        }));
        assert_eq!(pod_problems(&[p], now()), []);
    }

    #[test]
    fn an_oom_kill_counts_while_recent_or_while_the_container_is_down() {
        let status = |finished: &str, running: bool| {
            let state = if running {
                serde_json::json!({ "running": { "startedAt": finished } })
            } else {
                serde_json::json!({ "waiting": { "reason": "CrashLoopBackOff" } })
            };
            pod(serde_json::json!({
                "containerStatuses": [{
                    "name": "processor", "image": "x", "imageID": "", "ready": running, "restartCount": 2,
                    "state": state,
                    "lastState": { "terminated": { "exitCode": 137, "reason": "OOMKilled", "finishedAt": finished } },
                }],
            }))
        };
        let oom = PodProblem::OomKilled {
            pod: "dedup-0".into(),
            container: "processor".into(),
            restarts: 2,
        };
        assert_eq!(
            pod_problems(&[status("2026-12-01T09:58:00Z", true)], now()),
            std::slice::from_ref(&oom)
        );
        assert_eq!(
            pod_problems(&[status("2026-12-01T08:00:00Z", true)], now()),
            [],
            "an old OOM kill of a container that runs again is history"
        );
        assert_eq!(
            pod_problems(&[status("2026-12-01T08:00:00Z", false)], now()),
            [oom]
        );
    }

    #[test]
    fn an_unschedulable_pod_says_why() {
        let p = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient memory." }],
        }));
        assert_eq!(
            pod_problems(&[p], now())[0].describe(),
            "pod dedup-0 cannot be scheduled: 0/2 nodes are available: 2 Insufficient memory."
        );
    }
}
