//! What one reconcile of a running StreamApp decides, as a pure function of what it observed:
//! how many pods to run, the application reset's next step, how a scale-in proceeds, and when
//! to look again. The driver ([`super::reconcile_app`]) observes, calls [`plan`], and carries
//! the plan out; the tests below feed plain values in and check the decisions out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use streamapp_api::annotations::RESET;
use streamapp_api::crd::{PodStateStatus, StreamApp};
use streamapp_api::status_values::ResetPhase;

use super::{REQUEUE, REQUEUE_WHILE_KAFKA_TROUBLE};
use crate::status::{KafkaFinding, report_is_stale};
use crate::{reset, scaling};

/// How soon to reconcile again while a reset waits for pods, the group or Kafka.
pub const REQUEUE_WHILE_RESETTING: Duration = Duration::from_secs(2);

/// What the reconcile saw, as plain values.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The StatefulSet's replicas (None: it does not exist yet) and its ready pods.
    pub live_replicas: Option<i32>,
    pub ready_replicas: i32,
    /// The UID of each of the app's pods, by name.
    pub pod_uids: &'a BTreeMap<String, String>,
    /// The app's volume claims that still exist.
    pub claims: usize,
    /// What Kafka looked like.
    pub kafka: &'a KafkaFinding,
    /// The consumer group has no members.
    pub group_empty: bool,
    /// The app's internal topics (changelog, repartition) that still exist.
    pub internal_topics: usize,
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The StatefulSet's replicas now.
    pub replicas: i32,
    /// The input's partition count, when known: no more pods than partitions run.
    pub partitions_cap: Option<i32>,
    /// While a scale-in steps one pod at a time: what it waits for.
    pub scale_in_waiting: Option<String>,
    /// The application reset's status and its step now.
    pub reset: reset::Plan,
    /// When to reconcile again.
    pub requeue: Duration,
}

/// Whether Kafka must be looked at for a reset: one is asked for and not finished (the
/// annotation's value differs from the last reset's, or that reset is still under way).
pub fn resetting(app: &StreamApp) -> bool {
    let Some(requested) = app.annotations().get(RESET) else {
        return false;
    };
    app.status
        .as_ref()
        .and_then(|s| s.reset.as_ref())
        .is_none_or(|last| {
            last.request != *requested
                || !matches!(last.phase, ResetPhase::Done | ResetPhase::Failed)
        })
}

/// The decisions of one reconcile of a StreamApp that is neither deleted nor paused.
pub fn plan(app: &StreamApp, observed: &Observed, now: Timestamp) -> Plan {
    let partitions_cap = match observed.kafka {
        KafkaFinding::Seen {
            input_partitions: Some(p),
            ..
        } => Some(i32::try_from(*p).unwrap_or(i32::MAX)),
        _ => None,
    };
    let normal_replicas = partitions_cap.map_or(app.spec.replicas, |p| app.spec.replicas.min(p));
    let reset = reset::plan(
        app.annotations().get(RESET).map(String::as_str),
        app.status.as_ref().and_then(|s| s.reset.as_ref()),
        &reset::View {
            pods: observed.pod_uids.len(),
            group_empty: observed.group_empty,
            claims: observed.claims,
            internal_topics: observed.internal_topics,
            ready: observed.ready_replicas,
            desired: normal_replicas,
        },
        now,
    );
    let target = if reset.stops_pods() {
        0
    } else {
        normal_replicas
    };
    // Only the reports of the pods that exist now count (see `report_is_stale`).
    let reports: Vec<&PodStateStatus> = app
        .status
        .iter()
        .flat_map(|s| s.pods.iter())
        .filter(|r| !report_is_stale(r, observed.pod_uids))
        .collect();
    let step = scaling::next_step(
        &app.name_any(),
        observed.live_replicas,
        target,
        partitions_cap,
        &reports,
    );
    let kafka_trouble =
        !matches!(observed.kafka, KafkaFinding::Seen { problems, .. } if problems.is_empty());
    let requeue = match reset.action {
        reset::Action::None if !kafka_trouble => REQUEUE,
        // Nothing watches Kafka: a missing topic created later, a broker back, is seen then.
        reset::Action::None => REQUEUE_WHILE_KAFKA_TROUBLE,
        _ => REQUEUE_WHILE_RESETTING,
    };
    Plan {
        replicas: step.replicas,
        partitions_cap,
        scale_in_waiting: step.waiting,
        reset,
        requeue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::crd::{ResetStatus, StreamAppStatus, TaskStateStatus};
    use streamapp_api::status_values::TaskState;

    fn now() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    fn seen(partitions: usize) -> KafkaFinding {
        KafkaFinding::Seen {
            problems: Vec::new(),
            input_partitions: Some(partitions),
            lag: Some(0),
            lag_seconds: None,
            repartition_lag: None,
        }
    }

    fn uids(names: &[&str]) -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| (n.to_string(), format!("uid-{n}")))
            .collect()
    }

    /// A StatefulSet with `live` replicas, all ready, and the pods `pods`; a group with
    /// members, no claims or internal topics left over.
    fn observed<'a>(
        pods: &'a BTreeMap<String, String>,
        kafka: &'a KafkaFinding,
        live: Option<i32>,
    ) -> Observed<'a> {
        Observed {
            live_replicas: live,
            ready_replicas: live.unwrap_or(0),
            pod_uids: pods,
            claims: pods.len(),
            kafka,
            group_empty: false,
            internal_topics: 1,
        }
    }

    fn app(replicas: i32) -> StreamApp {
        let mut app = crate::testing::app();
        app.spec.replicas = replicas;
        app
    }

    #[test]
    fn no_more_pods_run_than_the_input_has_partitions() {
        let pods = uids(&[]);
        let kafka = seen(2);
        let observed = observed(&pods, &kafka, None);
        let plan = plan(&app(5), &observed, now());
        assert_eq!((plan.replicas, plan.partitions_cap), (2, Some(2)));
        assert_eq!(plan.requeue, REQUEUE);
    }

    #[test]
    fn while_kafka_cannot_be_read_the_spec_decides_and_the_next_look_is_soon() {
        let pods = uids(&[]);
        let kafka = KafkaFinding::Unreachable("no broker answered".into());
        let observed = observed(&pods, &kafka, None);
        let plan = plan(&app(3), &observed, now());
        assert_eq!((plan.replicas, plan.partitions_cap), (3, None));
        assert_eq!(plan.requeue, REQUEUE_WHILE_KAFKA_TROUBLE);
    }

    #[test]
    fn a_reset_asked_for_stops_every_pod_and_looks_again_soon() {
        let app = asking_reset(app(3), "earliest");
        let pods = uids(&["orders-0", "orders-1", "orders-2"]);
        let kafka = seen(3);
        let observed = observed(&pods, &kafka, Some(3));
        assert!(resetting(&app));
        let plan = plan(&app, &observed, now());
        assert!(plan.reset.stops_pods(), "{:?}", plan.reset);
        assert_eq!(plan.replicas, 0);
        assert_eq!(plan.requeue, REQUEUE_WHILE_RESETTING);
    }

    #[test]
    fn a_finished_reset_of_the_same_request_is_not_run_again() {
        let mut app = asking_reset(app(1), "earliest");
        app.status = Some(StreamAppStatus {
            reset: Some(ResetStatus {
                request: "earliest".into(),
                phase: ResetPhase::Done,
                message: None,
                started_at: None,
                finished_at: None,
            }),
            ..Default::default()
        });
        assert!(!resetting(&app));
        let pods = uids(&["orders-0"]);
        let kafka = seen(1);
        let observed = observed(&pods, &kafka, Some(1));
        let plan = plan(&app, &observed, now());
        assert_eq!((plan.replicas, plan.requeue), (1, REQUEUE));
    }

    /// `app` with the reset annotation asking for `request`.
    fn asking_reset(mut app: StreamApp, request: &str) -> StreamApp {
        app.metadata
            .annotations
            .get_or_insert_default()
            .insert(RESET.into(), request.into());
        app
    }

    /// A report whose pod holds `partitions` as the active task.
    fn report(pod: &str, partitions: &[i32], state: TaskState) -> PodStateStatus {
        PodStateStatus {
            name: pod.into(),
            uid: Some(format!("uid-{pod}")),
            processor_up: true,
            input_partitions: Some(2),
            tasks: partitions
                .iter()
                .map(|&partition| TaskStateStatus {
                    partition,
                    state: Some(state.clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_scale_in_waits_for_a_restoring_pod_but_not_for_a_replaced_pods_stale_report() {
        let mut app = app(1);
        // The report of a pod replaced since (another UID) says orders-0 restores.
        let mut stale = report("orders-0", &[0], TaskState::Restoring);
        stale.uid = Some("uid-of-a-pod-replaced-since".into());
        app.status = Some(StreamAppStatus {
            pods: vec![stale, report("orders-1", &[0, 1], TaskState::Active)],
            ..Default::default()
        });
        let pods = uids(&["orders-0", "orders-1"]);
        let kafka = seen(2);
        let observed = observed(&pods, &kafka, Some(2));
        let step = plan(&app, &observed, now());
        assert_eq!((step.replicas, step.scale_in_waiting), (1, None));

        // The current orders-0 says the same: the scale-in waits for it.
        app.status.as_mut().unwrap().pods[0] = report("orders-0", &[0], TaskState::Restoring);
        let waiting = plan(&app, &observed, now());
        assert_eq!(waiting.replicas, 2);
        assert!(
            waiting
                .scale_in_waiting
                .as_deref()
                .is_some_and(|w| w.contains("waiting for orders-0 partition 0 to restore")),
            "{waiting:?}"
        );
    }
}
