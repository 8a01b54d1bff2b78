//! What each operating command changes, and what it tells the user to watch next. Each is a
//! thin wrapper over what the operator offers (the annotations of
//! `streamapp_api::annotations`) or what Kubernetes does (a pod deletion runs its preStop
//! drain); nothing here talks to the API server.

use streamapp_api::annotations::{PAUSED, RESET, RESTART};
use streamapp_api::status_values::{ResetPhase, StoreOpen};

/// Where a reset moves the input offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    /// An RFC 3339 time.
    DateTime(String),
}

impl ResetTo {
    /// The annotation's value.
    pub fn value(&self) -> String {
        match self {
            ResetTo::Earliest => "earliest".into(),
            ResetTo::Latest => "latest".into(),
            ResetTo::DateTime(t) => t.clone(),
        }
    }
}

/// Checks a `--to-datetime` value the way the operator will read it.
pub fn parse_datetime(value: &str) -> Result<ResetTo, String> {
    value
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| ResetTo::DateTime(t.to_string()))
        .map_err(|e| {
            format!(
                "--to-datetime {value:?} is not an RFC 3339 time (e.g. 2026-12-01T09:00:00Z): {e}"
            )
        })
}

/// A merge patch of the StreamApp's annotations and the sentences to print after it.
#[derive(Debug, PartialEq)]
pub struct Change {
    pub patch: serde_json::Value,
    pub done: String,
    pub next: String,
}

fn annotate(key: &str, value: Option<String>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { key: value } } })
}

pub fn pause(ns: &str, name: &str) -> Change {
    Change {
        patch: annotate(PAUSED, Some("true".into())),
        done: format!(
            "paused {ns}/{name}: the operator changes nothing of it until it is resumed (pods keep running)"
        ),
        next: format!(
            "kubectl streamapp status {name} -n {ns}   # condition ReconciliationPaused True"
        ),
    }
}

pub fn resume(ns: &str, name: &str) -> Change {
    Change {
        patch: annotate(PAUSED, None),
        done: format!("resumed {ns}/{name}: spec changes made while paused are applied now"),
        next: format!("kubectl streamapp status {name} -n {ns} --watch"),
    }
}

/// `requested_at`: the annotation's value, by convention the time of the request.
pub fn restart(ns: &str, name: &str, requested_at: &str) -> Change {
    Change {
        patch: annotate(RESTART, Some(requested_at.into())),
        done: format!(
            "restarting {ns}/{name}: its pods roll one at a time, each stopping with a drain"
        ),
        next: format!(
            "kubectl streamapp status {name} -n {ns} --watch   # Progressing RollingOut, then RolloutComplete"
        ),
    }
}

pub fn reset(ns: &str, name: &str, to: &ResetTo) -> Change {
    Change {
        patch: annotate(RESET, Some(to.value())),
        done: format!(
            "resetting {ns}/{name} to {}: the operator stops the pods, moves the consumer group's input offsets, \
             deletes the state volumes and internal topics, and starts the pods again",
            to.value()
        ),
        next: format!(
            "kubectl streamapp status {name} -n {ns} --watch   # reset phase, {} at the end",
            ResetPhase::Done
        ),
    }
}

/// What `reset` asks before it acts, unless `--yes`.
pub fn reset_warning(ns: &str, name: &str, to: &ResetTo) -> String {
    format!(
        "This deletes the state of {ns}/{name} (stores and changelog) and reprocesses the input from {}. \
         Records already output stay in the output topic. Run again with --yes to go ahead.",
        to.value()
    )
}

/// The sentences around a drain: the pod is deleted, the kubelet runs its preStop hook
/// (`streamapp-processor drain`: finish the transaction, flush, checkpoint) and the StatefulSet
/// starts it again, which then replays nothing.
pub fn drain(ns: &str, pod: &str, app: &str) -> (String, String) {
    (
        format!(
            "draining {ns}/{pod}: deleted with its grace period, so the kubelet runs the preStop drain; the StatefulSet starts it again"
        ),
        format!(
            "kubectl streamapp status {app} -n {ns} --watch   # {pod}: last shutdown clean, opened {}",
            StoreOpen::Clean
        ),
    )
}

/// The StreamApp a pod belongs to, from its `streamapp.dev/app` label.
pub fn app_of_pod(labels: &std::collections::BTreeMap<String, String>) -> Option<&str> {
    labels.get("streamapp.dev/app").map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_sets_or_removes_exactly_its_annotation() {
        assert_eq!(
            pause("prod", "orders").patch,
            serde_json::json!({ "metadata": { "annotations": { "streamapp.dev/paused": "true" } } })
        );
        assert_eq!(
            resume("prod", "orders").patch,
            serde_json::json!({ "metadata": { "annotations": { "streamapp.dev/paused": null } } })
        );
        assert_eq!(
            restart("prod", "orders", "2026-12-01T10:00:00Z").patch,
            serde_json::json!({ "metadata": { "annotations": { "streamapp.dev/restart": "2026-12-01T10:00:00Z" } } })
        );
        assert_eq!(
            reset("prod", "orders", &ResetTo::Latest).patch,
            serde_json::json!({ "metadata": { "annotations": { "streamapp.dev/reset": "latest" } } })
        );
    }

    #[test]
    fn a_reset_datetime_must_be_rfc_3339() {
        assert_eq!(
            parse_datetime("2026-12-01T09:00:00Z"),
            Ok(ResetTo::DateTime("2026-12-01T09:00:00Z".into()))
        );
        let e = parse_datetime("yesterday").unwrap_err();
        assert!(
            e.starts_with("--to-datetime \"yesterday\" is not an RFC 3339 time"),
            "{e}"
        );
    }
}
