//! Cleaning up after a deleted StreamApp with `deletionPolicy: Delete`.
//!
//! The StreamApp carries the finalizer [`FINALIZER`] while its policy is `Delete`. Once it is
//! being deleted the operator stops its pods (the consumer group must be empty before the
//! broker deletes it), deletes the group and the internal topics, and removes the finalizer;
//! the garbage collector then deletes the owned objects. A cleanup that cannot finish (Kafka
//! unreachable, credentials gone) is given up after [`TIMEOUT`] with a Warning event: a
//! StreamApp's deletion never blocks for ever. [`plan`] decides; the reconciler acts.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use streamapp_api::crd::{DeletionPolicy, StreamApp};

pub const FINALIZER: &str = "streamapp.dev/cleanup";
/// How long a cleanup may take before the finalizer is removed anyway.
pub const TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What the finalizer needs now, for a StreamApp that is not being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinalizerChange {
    Add,
    Remove,
    Keep,
}

/// Whether the finalizer should be added or removed for the StreamApp's policy.
pub fn finalizer_change(app: &StreamApp) -> FinalizerChange {
    let has = app
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    match (app.spec.deletion_policy, has) {
        (DeletionPolicy::Delete, false) => FinalizerChange::Add,
        (DeletionPolicy::Retain, true) => FinalizerChange::Remove,
        _ => FinalizerChange::Keep,
    }
}

/// The next step of the cleanup of a StreamApp that is being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Not ours to clean up (no finalizer): the garbage collector does the rest.
    Nothing,
    /// Stop the pods and wait for them, and for the group's members to time out.
    StopPods { pods: usize },
    /// Delete the consumer group and the internal topics, then the finalizer.
    DeleteFromKafka,
    /// Past the timeout: remove the finalizer, say what was left.
    GiveUp,
}

/// `deleting_since`: the StreamApp's deletionTimestamp.
pub fn plan(
    app: &StreamApp,
    deleting_since: Timestamp,
    now: Timestamp,
    pods: usize,
    group_empty: bool,
) -> Step {
    if !app
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
    {
        return Step::Nothing;
    }
    if now.duration_since(deleting_since).unsigned_abs() > TIMEOUT {
        return Step::GiveUp;
    }
    if pods > 0 || !group_empty {
        return Step::StopPods { pods };
    }
    Step::DeleteFromKafka
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    fn deleting(policy: DeletionPolicy, finalizer: bool) -> StreamApp {
        let mut app = app();
        app.spec.deletion_policy = policy;
        if finalizer {
            app.metadata.finalizers = Some(vec![FINALIZER.into()]);
        }
        app
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_finalizer_follows_the_deletion_policy() {
        assert_eq!(
            finalizer_change(&deleting(DeletionPolicy::Delete, false)),
            FinalizerChange::Add
        );
        assert_eq!(
            finalizer_change(&deleting(DeletionPolicy::Delete, true)),
            FinalizerChange::Keep
        );
        assert_eq!(
            finalizer_change(&deleting(DeletionPolicy::Retain, true)),
            FinalizerChange::Remove
        );
        assert_eq!(
            finalizer_change(&deleting(DeletionPolicy::Retain, false)),
            FinalizerChange::Keep
        );
    }

    #[test]
    fn the_pods_stop_before_kafka_is_cleaned_and_a_cleanup_that_hangs_is_given_up() {
        let app = deleting(DeletionPolicy::Delete, true);
        let since = at("2026-12-01T10:00:00Z");
        assert_eq!(
            plan(&app, since, at("2026-12-01T10:00:05Z"), 2, false),
            Step::StopPods { pods: 2 }
        );
        assert_eq!(
            plan(&app, since, at("2026-12-01T10:00:20Z"), 0, false),
            Step::StopPods { pods: 0 }
        );
        assert_eq!(
            plan(&app, since, at("2026-12-01T10:00:30Z"), 0, true),
            Step::DeleteFromKafka
        );
        assert_eq!(
            plan(&app, since, at("2026-12-01T10:05:01Z"), 0, false),
            Step::GiveUp
        );
        assert_eq!(
            plan(
                &deleting(DeletionPolicy::Retain, false),
                since,
                since,
                2,
                false
            ),
            Step::Nothing
        );
    }
}
