//! The values of the StreamApp status fields that are enumerations: what the operator, the
//! agents and `kubectl streamapp` write and compare, spelled once.
//!
//! On the wire (and in the CRD) each is a plain string, the variant's name: the schema lists no
//! allowed values, so an older CRD accepts what a newer agent or operator writes. A value this
//! version does not know (written by another version) is read as `Other` and written back as
//! it was, so reading a StreamApp never fails on one and writing its status back loses nothing.
//!
//! Several mirror an enumeration of the processor's health file ([`crate::health`]): the agent
//! reports them with the `From` conversions here. The two are separate contracts (the health
//! file is read by the agent of the same pod, the status by every version of every program),
//! so they are separate types.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::health;

/// An enumeration of status values: the variants, whose names are the wire values, and
/// `Other` for a value written by another version.
macro_rules! status_values {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$variant_meta:meta])* $variant:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_meta])* $variant,)+
            /// A value this version does not know, written by another version of StreamApp:
            /// kept as it was written.
            Other(String),
        }

        impl $name {
            /// Every value this version knows, in order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant,)+];

            /// The value as the status spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => stringify!($variant),)+
                    $name::Other(value) => value,
                }
            }

            fn from_wire(value: String) -> Self {
                match value.as_str() {
                    $(stringify!($variant) => $name::$variant,)+
                    _ => $name::Other(value),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map($name::from_wire)
            }
        }

        /// A plain string in the CRD's schema (see the module's documentation).
        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                String::schema_name()
            }

            fn json_schema(generator: &mut SchemaGenerator) -> Schema {
                String::json_schema(generator)
            }
        }
    };
}

status_values! {
    /// `status.phase`: where the StreamApp as a whole is.
    pub enum AppPhase {
        /// The StatefulSet does not exist yet.
        Pending,
        /// Pods are being created, rolled out, scaled or are restoring their stores.
        Progressing,
        /// Every pod is ready and runs the current spec.
        Running,
        /// Something needs attention: the Degraded condition says what.
        Degraded,
        /// Scaled to zero (`spec.replicas` is 0, or a reset stops the pods).
        Stopped,
    }
}

status_values! {
    /// `status.stateHealth`: the worst of the pods' state reports (the StateHealthy condition).
    pub enum StateHealth {
        /// Every reporting pod's stores are usable.
        Healthy,
        /// A processor failed or is down, a store is being rebuilt or cannot be used for now.
        Degraded,
        /// No agent has reported yet.
        Unknown,
    }
}

status_values! {
    /// `status.reset.phase`: where an application reset (`streamapp.dev/reset`) is.
    pub enum ResetPhase {
        /// Waiting for the pods to drain and stop and the consumer group's members to go.
        StoppingPods,
        /// Moving the consumer group's input offsets.
        ResettingOffsets,
        /// Deleting the state volumes and the internal topics.
        ClearingState,
        /// Waiting for the pods to start again and become ready.
        StartingPods,
        /// The reset is complete.
        Done,
        /// The reset could not run (the message says why); nothing was changed.
        Failed,
    }
}

status_values! {
    /// `status.pods[].phase`: what the pod's processor is doing, as its agent saw it.
    pub enum PodPhase {
        /// Opening its stores and joining the consumer group.
        Starting,
        /// Replaying changelog tails into its stores; not ready.
        Restoring,
        /// Processing input.
        Running,
        /// Finishing its transaction, flushing its stores and writing checkpoints.
        Draining,
        /// Drained and stopping: the next start restores nothing.
        Drained,
        /// Stopped on an error (the message says which).
        Failed,
        /// No processor runs, and the last one did not stop with a drain (or none ever started
        /// on this volume).
        Down,
    }
}

status_values! {
    /// `status.pods[].drainRequestedBy`: who asked for the pod's last drain.
    pub enum DrainRequest {
        /// The preStop hook (`streamapp-processor drain`).
        Http,
        /// SIGTERM without a preStop drain first.
        Signal,
    }
}

status_values! {
    /// `status.pods[].tasks[].state`: where a task (an input partition's store) is.
    pub enum TaskState {
        /// Assigned; the store is being opened.
        Opening,
        /// Replaying the changelog tail into the store.
        Restoring,
        /// Restored; processing starts once the open transaction commits.
        Restored,
        /// Processing records.
        Active,
        /// The store cannot be used for now (a full disk, an I/O error, its lock held): retried
        /// later, nothing quarantined.
        BackingOff,
        /// A standby copy: the store follows the changelog, ready to take the partition over.
        Standby,
        /// A standby warming up to take the partition over on this pod.
        WarmingUp,
    }
}

status_values! {
    /// `status.pods[].tasks[].opened`: how the task's store was opened.
    pub enum StoreOpen {
        /// After a drain: nothing to replay.
        Clean,
        /// After an unclean stop: the changelog tail was replayed.
        ReplayedTail,
        /// No local store: restored from the whole changelog.
        FullRestore,
        /// The store was damaged: quarantined and rebuilt from the changelog.
        Rebuilt,
        /// The partition came back while its store was still open: the tail was replayed.
        Resumed,
    }
}

impl From<health::ProcessorPhase> for PodPhase {
    fn from(phase: health::ProcessorPhase) -> Self {
        match phase {
            health::ProcessorPhase::Starting => PodPhase::Starting,
            health::ProcessorPhase::Restoring => PodPhase::Restoring,
            health::ProcessorPhase::Running => PodPhase::Running,
            health::ProcessorPhase::Draining => PodPhase::Draining,
            health::ProcessorPhase::Drained => PodPhase::Drained,
            health::ProcessorPhase::Failed => PodPhase::Failed,
        }
    }
}

impl From<health::DrainRequest> for DrainRequest {
    fn from(by: health::DrainRequest) -> Self {
        match by {
            health::DrainRequest::Http => DrainRequest::Http,
            health::DrainRequest::Signal => DrainRequest::Signal,
        }
    }
}

impl From<health::TaskState> for TaskState {
    fn from(state: health::TaskState) -> Self {
        match state {
            health::TaskState::Opening => TaskState::Opening,
            health::TaskState::Restoring => TaskState::Restoring,
            health::TaskState::Restored => TaskState::Restored,
            health::TaskState::Active => TaskState::Active,
            health::TaskState::BackingOff => TaskState::BackingOff,
            health::TaskState::Standby => TaskState::Standby,
            health::TaskState::WarmingUp => TaskState::WarmingUp,
        }
    }
}

impl From<health::StoreOpen> for StoreOpen {
    fn from(open: health::StoreOpen) -> Self {
        match open {
            health::StoreOpen::Clean => StoreOpen::Clean,
            health::StoreOpen::ReplayedTail => StoreOpen::ReplayedTail,
            health::StoreOpen::FullRestore => StoreOpen::FullRestore,
            health::StoreOpen::Rebuilt => StoreOpen::Rebuilt,
            health::StoreOpen::Resumed => StoreOpen::Resumed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::StreamApp;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// `known` are exactly `wire`, in order, and each goes through JSON unchanged.
    fn spelled<T>(known: &[T], as_str: fn(&T) -> &str, wire: &[&str])
    where
        T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
    {
        assert_eq!(known.iter().map(as_str).collect::<Vec<_>>(), wire);
        for value in known {
            let json = serde_json::to_value(value).unwrap();
            assert_eq!(json, json!(as_str(value)));
            assert_eq!(&serde_json::from_value::<T>(json).unwrap(), value);
        }
    }

    #[test]
    fn the_wire_values_are_the_ones_the_status_always_had() {
        spelled(
            AppPhase::KNOWN,
            AppPhase::as_str,
            &["Pending", "Progressing", "Running", "Degraded", "Stopped"],
        );
        spelled(
            StateHealth::KNOWN,
            StateHealth::as_str,
            &["Healthy", "Degraded", "Unknown"],
        );
        spelled(
            ResetPhase::KNOWN,
            ResetPhase::as_str,
            &[
                "StoppingPods",
                "ResettingOffsets",
                "ClearingState",
                "StartingPods",
                "Done",
                "Failed",
            ],
        );
        spelled(
            PodPhase::KNOWN,
            PodPhase::as_str,
            &[
                "Starting",
                "Restoring",
                "Running",
                "Draining",
                "Drained",
                "Failed",
                "Down",
            ],
        );
        spelled(
            DrainRequest::KNOWN,
            DrainRequest::as_str,
            &["Http", "Signal"],
        );
        spelled(
            TaskState::KNOWN,
            TaskState::as_str,
            &[
                "Opening",
                "Restoring",
                "Restored",
                "Active",
                "BackingOff",
                "Standby",
                "WarmingUp",
            ],
        );
        spelled(
            StoreOpen::KNOWN,
            StoreOpen::as_str,
            &["Clean", "ReplayedTail", "FullRestore", "Rebuilt", "Resumed"],
        );
    }

    /// Whatever the health file says is reported in the status with the same word.
    #[test]
    fn the_status_spells_the_health_files_values_as_the_health_file_does() {
        fn same<H: Serialize + Copy, S: From<H> + Serialize>(values: &[H]) {
            for &h in values {
                assert_eq!(
                    serde_json::to_value(S::from(h)).unwrap(),
                    serde_json::to_value(h).unwrap()
                );
            }
        }
        use health::ProcessorPhase as P;
        same::<_, PodPhase>(&[
            P::Starting,
            P::Restoring,
            P::Running,
            P::Draining,
            P::Drained,
            P::Failed,
        ]);
        same::<_, DrainRequest>(&[health::DrainRequest::Http, health::DrainRequest::Signal]);
        use health::TaskState as T;
        same::<_, TaskState>(&[
            T::Opening,
            T::Restoring,
            T::Restored,
            T::Active,
            T::BackingOff,
            T::Standby,
            T::WarmingUp,
        ]);
        use health::StoreOpen as O;
        same::<_, StoreOpen>(&[
            O::Clean,
            O::ReplayedTail,
            O::FullRestore,
            O::Rebuilt,
            O::Resumed,
        ]);
    }

    #[test]
    fn values_written_by_another_version_are_read_and_written_back_as_they_were() {
        let app = json!({
            "apiVersion": "streamapp.dev/v1alpha1",
            "kind": "StreamApp",
            "metadata": { "name": "orders", "namespace": "prod" },
            "spec": {
                "image": "streamapp:1",
                "kafka": { "bootstrapServers": "kafka:9092" },
                "topology": { "inputTopic": "in", "outputTopic": "out", "deadLetterTopic": "dlq" }
            },
            "status": {
                "phase": "Hibernating",
                "stateHealth": "Suspect",
                "reset": { "request": "earliest", "phase": "VerifyingOffsets" },
                "pods": [{
                    "name": "orders-0",
                    "phase": "Migrating",
                    "drainRequestedBy": "Operator",
                    "tasks": [{ "partition": 0, "state": "Paused", "opened": "FromSnapshot" }]
                }]
            }
        });
        let read: StreamApp = serde_json::from_value(app.clone()).expect("read despite the values");
        let status = read.status.as_ref().unwrap();
        assert_eq!(status.phase, Some(AppPhase::Other("Hibernating".into())));
        assert_eq!(
            status.state_health,
            Some(StateHealth::Other("Suspect".into()))
        );
        assert_eq!(
            status.reset.as_ref().unwrap().phase,
            ResetPhase::Other("VerifyingOffsets".into())
        );
        let pod = &status.pods[0];
        assert_eq!(pod.phase, Some(PodPhase::Other("Migrating".into())));
        assert_eq!(
            pod.drain_requested_by,
            Some(DrainRequest::Other("Operator".into()))
        );
        assert_eq!(pod.tasks[0].state, Some(TaskState::Other("Paused".into())));
        assert_eq!(
            pod.tasks[0].opened,
            Some(StoreOpen::Other("FromSnapshot".into()))
        );
        let written = serde_json::to_value(&read).unwrap();
        for pointer in [
            "/status/phase",
            "/status/stateHealth",
            "/status/reset/phase",
            "/status/pods/0/phase",
            "/status/pods/0/drainRequestedBy",
            "/status/pods/0/tasks/0/state",
            "/status/pods/0/tasks/0/opened",
        ] {
            assert_eq!(written.pointer(pointer), app.pointer(pointer), "{pointer}");
        }
    }

    #[test]
    fn a_value_that_is_not_a_string_is_still_refused() {
        assert!(serde_json::from_value::<PodPhase>(json!(3)).is_err());
    }

    #[test]
    fn the_crd_schema_of_each_is_a_plain_string() {
        let schema = serde_json::to_value(schemars::schema_for!(TaskState)).unwrap();
        assert_eq!(schema["type"], "string");
        assert!(schema.get("enum").is_none() && schema.get("oneOf").is_none());
    }
}
