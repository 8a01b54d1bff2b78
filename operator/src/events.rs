//! The Kubernetes Events a reconcile publishes on its StreamApp: created, scaled, rolling out,
//! degraded, recovered, storage resizing and resized.
//!
//! Decided by pure functions from what changed (live StatefulSet against the desired one,
//! previous status against the new one), so each event is published once per change, not at
//! every reconcile.

use k8s_openapi::api::apps::v1::StatefulSet;
use streamapp_api::crd::StreamAppStatus;

use crate::statefulset::{PROCESSOR_CONTAINER, config_hash};
use crate::status::{DEGRADED, PROGRESSING, STORAGE_RESIZING, condition_of};
use crate::storage::STORAGE_NOT_EXPANDABLE;

/// An event to publish: `warning` for the Warning type, else Normal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    /// CamelCase, shown as Reason by `kubectl describe`.
    pub reason: &'static str,
    pub note: String,
}

impl Notice {
    fn normal(reason: &'static str, note: String) -> Self {
        Notice {
            warning: false,
            reason,
            note,
        }
    }
    fn warning(reason: &'static str, note: String) -> Self {
        Notice {
            warning: true,
            reason,
            note,
        }
    }
}

/// What applying `desired` changes about the live StatefulSet (None: it does not exist yet).
pub fn workload_changes(live: Option<&StatefulSet>, desired: &StatefulSet) -> Vec<Notice> {
    let Some(live) = live else {
        return vec![Notice::normal(
            "Created",
            format!(
                "created StatefulSet, Service, ConfigMap, PodDisruptionBudget and RBAC for {} replicas",
                replicas(desired)
            ),
        )];
    };
    let mut notices = Vec::new();
    if replicas(live) != replicas(desired) {
        notices.push(Notice::normal(
            "Scaled",
            format!(
                "scaled from {} to {} replicas",
                replicas(live),
                replicas(desired)
            ),
        ));
    }
    let (live_image, desired_image) = (processor_image(live), processor_image(desired));
    let (live_hash, desired_hash) = (config_hash(live), config_hash(desired));
    let mut why = Vec::new();
    if live_image != desired_image {
        why.push(format!(
            "image {} -> {}",
            live_image.unwrap_or("?"),
            desired_image.unwrap_or("?")
        ));
    }
    if live_hash != desired_hash {
        why.push(format!(
            "configuration {} -> {}",
            short(live_hash),
            short(desired_hash)
        ));
    }
    if !why.is_empty() {
        notices.push(Notice::normal(
            "RollingOut",
            format!("rolling out a new pod template ({}): one pod at a time, each after the previous one is ready", why.join(", ")),
        ));
    }
    notices
}

/// What the new status says that the previous one did not.
pub fn status_changes(previous: Option<&StreamAppStatus>, new: &StreamAppStatus) -> Vec<Notice> {
    let mut notices = Vec::new();
    let was = previous
        .and_then(|p| condition_of(p, DEGRADED))
        .filter(|c| c.status == "True");
    let is = condition_of(new, DEGRADED).filter(|c| c.status == "True");
    match (was, is) {
        (None, Some(now)) => notices.push(Notice::warning(
            "Degraded",
            format!("{}: {}", now.reason, now.message),
        )),
        (Some(before), Some(now)) if before.reason != now.reason => notices.push(Notice::warning(
            "Degraded",
            format!("{}: {}", now.reason, now.message),
        )),
        (Some(before), None) => notices.push(Notice::normal(
            "Recovered",
            format!("no longer degraded ({} resolved)", before.reason),
        )),
        _ => {}
    }
    let resizing = |s: Option<&StreamAppStatus>| {
        s.and_then(|s| condition_of(s, PROGRESSING))
            .is_some_and(|c| c.status == "True" && c.reason == STORAGE_RESIZING)
    };
    if resizing(previous)
        && !resizing(Some(new))
        && condition_of(new, DEGRADED).is_none_or(|c| c.reason != STORAGE_NOT_EXPANDABLE)
    {
        notices.push(Notice::normal(
            "StorageResized",
            "every volume claim has the size spec.storage asks for".into(),
        ));
    }
    notices
}

fn replicas(sts: &StatefulSet) -> i32 {
    sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn processor_image(sts: &StatefulSet) -> Option<&str> {
    sts.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == PROCESSOR_CONTAINER)?
        .image
        .as_deref()
}

fn short(hash: Option<&str>) -> &str {
    hash.map_or("?", |h| &h[..h.len().min(12)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statefulset::desired_statefulset;
    use crate::testing::app;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn status_with(type_: &str, status: &str, reason: &str) -> StreamAppStatus {
        StreamAppStatus {
            conditions: vec![Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: "why".into(),
                observed_generation: None,
                last_transition_time: Time("2026-01-01T00:00:00Z".parse().unwrap()),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn first_apply_is_created() {
        let notices = workload_changes(None, &desired_statefulset(&app(), "h1", None));
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].reason, "Created");
    }

    #[test]
    fn a_new_image_and_replica_count_are_rolling_out_and_scaled() {
        let live = desired_statefulset(&app(), "h1", None);
        let mut changed = app();
        changed.spec.image = "registry.example/streamapp:1.1".into();
        changed.spec.replicas = 5;
        let notices = workload_changes(Some(&live), &desired_statefulset(&changed, "h1", None));
        let reasons: Vec<_> = notices.iter().map(|n| n.reason).collect();
        assert_eq!(reasons, ["Scaled", "RollingOut"]);
        assert_eq!(notices[0].note, "scaled from 3 to 5 replicas");
        assert!(
            notices[1]
                .note
                .contains("image registry.example/streamapp:1.0 -> registry.example/streamapp:1.1"),
            "{}",
            notices[1].note
        );
    }

    #[test]
    fn an_unchanged_workload_says_nothing() {
        let live = desired_statefulset(&app(), "h1", None);
        assert!(workload_changes(Some(&live), &desired_statefulset(&app(), "h1", None)).is_empty());
    }

    #[test]
    fn degraded_and_recovered_are_published_on_transitions_only() {
        let ok = status_with("Degraded", "False", "AsExpected");
        let bad = status_with("Degraded", "True", "MemoryBudgetExceeded");
        let became = status_changes(Some(&ok), &bad);
        assert_eq!((became[0].reason, became[0].warning), ("Degraded", true));
        assert!(status_changes(Some(&bad), &bad).is_empty());
        let recovered = status_changes(Some(&bad), &ok);
        assert_eq!(
            (recovered[0].reason, recovered[0].warning),
            ("Recovered", false)
        );
    }

    #[test]
    fn storage_resized_follows_the_end_of_storage_resizing() {
        let resizing = status_with("Progressing", "True", "StorageResizing");
        let done = status_with("Progressing", "False", "RolloutComplete");
        let notices = status_changes(Some(&resizing), &done);
        assert_eq!(notices[0].reason, "StorageResized");
        assert!(status_changes(Some(&done), &done).is_empty());
    }
}
