//! Scale-in one pod at a time, each step once the remaining pods hold the state.
//!
//! A partition that leaves a pod is restored from its changelog by the pod that takes it over
//! (or, once the group assigns standbys, caught up from the standby it kept). Going from 6
//! pods to 2 in one step makes four pods' partitions restore at once on two pods, with nothing
//! processed meanwhile; an autoscaler that scales in and out again turns that into a restore
//! storm. So the operator lowers the StatefulSet's replicas by one, and takes the next step
//! only when the agents of the pods that remain report every input partition held (opened and
//! restored, or processing; a standby or warm-up does not count) and none still restoring. Scaling out, scaling to zero (stopping, a reset) and the first creation are not
//! stepped: nothing restores on the pods that remain.
//!
//! What the agents report is all this looks at. A remaining pod whose processor is down cannot
//! take anything over, so waiting for it would hold the scale-in for good: the step is taken,
//! and the pod's own problem shows in the conditions. Pods without a report (the agent is
//! disabled, or has not written yet) are not waited for.

use streamapp_api::config::pod_of_group_member;
use streamapp_api::crd::PodStateStatus;
use streamapp_api::status_values::TaskState;

use crate::owned::pod_ordinal;

/// Task states of a store that is not usable yet.
const NOT_YET_HELD: [TaskState; 2] = [TaskState::Opening, TaskState::Restoring];
/// Task states of a replica that keeps a store warm but does not process the partition: a pod
/// with only these has not taken the partition over.
const REPLICA_ONLY: [TaskState; 2] = [TaskState::Standby, TaskState::WarmingUp];

/// What the next scale step is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleStep {
    /// Replicas to give the StatefulSet now.
    pub replicas: i32,
    /// While a scale-in waits: what it waits for (the Progressing condition's message).
    pub waiting: Option<String>,
}

/// The replicas to run now, given the StatefulSet's current `live` replicas (None: it does
/// not exist yet), the `target`, the input's partition count if known, and the agents'
/// reports of the app's pods (`<app>-<ordinal>`).
pub fn next_step(
    app: &str,
    live: Option<i32>,
    target: i32,
    partitions: Option<i32>,
    reports: &[&PodStateStatus],
) -> ScaleStep {
    let go = |replicas| ScaleStep {
        replicas,
        waiting: None,
    };
    let Some(live) = live else {
        return go(target);
    };
    if target >= live || target == 0 {
        return go(target);
    }
    let remaining: Vec<&PodStateStatus> = reports
        .iter()
        .copied()
        .filter(|r| pod_ordinal(app, &r.name).is_some_and(|o| o < live))
        .collect();
    let restoring: Vec<String> = remaining
        .iter()
        .flat_map(|r| {
            r.tasks
                .iter()
                .filter(|t| t.state.as_ref().is_some_and(|s| NOT_YET_HELD.contains(s)))
                .map(move |t| format!("{} partition {}", r.name, t.partition))
        })
        .collect();
    let wait = |why: String| ScaleStep {
        replicas: live,
        waiting: Some(format!(
            "scaling in from {live} to {target} pods one at a time: {why}"
        )),
    };
    if !restoring.is_empty() {
        return wait(format!("waiting for {} to restore", restoring.join(", ")));
    }
    // Whether the remaining pods cover the partitions can only be told when every one of them
    // reports and can take partitions over.
    let all_reporting = remaining.len() == usize::try_from(live).unwrap_or(0)
        && remaining.iter().all(|r| r.processor_up);
    let partitions =
        partitions.or_else(|| remaining.iter().filter_map(|r| r.input_partitions).max());
    if let (Some(partitions), true) = (partitions, all_reporting) {
        let mut held: Vec<i32> = remaining
            .iter()
            .flat_map(|r| {
                r.tasks
                    .iter()
                    .filter(|t| t.state.as_ref().is_none_or(|s| !REPLICA_ONLY.contains(s)))
                    .map(|t| t.partition)
            })
            .collect();
        held.sort_unstable();
        held.dedup();
        let unheld: Vec<String> = (0..partitions)
            .filter(|p| held.binary_search(p).is_err())
            .map(|p| p.to_string())
            .collect();
        if !unheld.is_empty() {
            return wait(format!(
                "waiting for the remaining pods to take over partition(s) {}",
                unheld.join(", ")
            ));
        }
    }
    go(live - 1)
}

/// The static members of the app's consumer group (`members`: their instance ids) that
/// belong to pods a scale-in removed for good: an ordinal at or past `replicas` (the
/// StatefulSet's) and no pod object left (`pods`: the names of the app's pods, terminating
/// ones included: a pod still draining commits as that member first). A static member that
/// goes away without leaving keeps its partitions until the session timeout, as a restarted
/// pod should; one whose pod will not come back is removed so the group rebalances at once.
pub fn departed_members(
    app: &str,
    replicas: i32,
    members: &[String],
    pods: &[String],
) -> Vec<String> {
    members
        .iter()
        .filter(|member| {
            let pod = pod_of_group_member(member);
            pod_ordinal(app, pod).is_some_and(|o| o >= replicas) && !pods.iter().any(|p| p == pod)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::crd::TaskStateStatus;

    fn pod(name: &str, up: bool, tasks: &[(i32, TaskState)]) -> PodStateStatus {
        PodStateStatus {
            name: name.to_string(),
            processor_up: up,
            tasks: tasks
                .iter()
                .map(|(p, s)| TaskStateStatus {
                    partition: *p,
                    state: Some(s.clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn step(live: Option<i32>, target: i32, reports: &[PodStateStatus]) -> ScaleStep {
        let refs: Vec<&PodStateStatus> = reports.iter().collect();
        next_step("orders", live, target, Some(4), &refs)
    }

    #[test]
    fn creating_scaling_out_and_stopping_go_straight_to_the_target() {
        assert_eq!(step(None, 3, &[]).replicas, 3);
        assert_eq!(step(Some(1), 4, &[]).replicas, 4);
        assert_eq!(step(Some(4), 0, &[]).replicas, 0);
        assert_eq!(step(Some(2), 2, &[]).waiting, None);
    }

    #[test]
    fn scale_in_takes_one_step_when_the_remaining_pods_hold_every_partition() {
        let reports = [
            pod(
                "orders-0",
                true,
                &[(0, TaskState::Active), (1, TaskState::Active)],
            ),
            pod(
                "orders-1",
                true,
                &[(2, TaskState::Active), (3, TaskState::Restored)],
            ),
            pod("orders-2", true, &[]),
        ];
        assert_eq!(
            step(Some(3), 1, &reports),
            ScaleStep {
                replicas: 2,
                waiting: None
            }
        );
    }

    #[test]
    fn scale_in_waits_while_a_remaining_pod_restores() {
        let reports = [
            pod(
                "orders-0",
                true,
                &[(0, TaskState::Active), (1, TaskState::Restoring)],
            ),
            pod(
                "orders-1",
                true,
                &[(2, TaskState::Active), (3, TaskState::Active)],
            ),
        ];
        let s = step(Some(2), 1, &reports);
        assert_eq!(s.replicas, 2);
        assert_eq!(
            s.waiting.as_deref(),
            Some(
                "scaling in from 2 to 1 pods one at a time: waiting for orders-0 partition 1 to restore"
            )
        );
    }

    #[test]
    fn scale_in_waits_until_the_partitions_of_the_pod_that_went_are_taken_over() {
        // orders-2 went in the previous step; its partitions 2 and 3 are not owned yet.
        let reports = [
            pod("orders-0", true, &[(0, TaskState::Active)]),
            pod("orders-1", true, &[(1, TaskState::Active)]),
            pod(
                "orders-2",
                true,
                &[(2, TaskState::Active), (3, TaskState::Active)],
            ),
        ];
        let s = step(Some(2), 1, &reports);
        assert_eq!(s.replicas, 2);
        assert!(
            s.waiting.unwrap().ends_with("take over partition(s) 2, 3"),
            "a report of a pod beyond the live replicas does not count"
        );
    }

    #[test]
    fn a_remaining_pod_that_is_down_or_unreported_does_not_hold_the_scale_in_for_good() {
        let down = [
            pod("orders-0", true, &[(0, TaskState::Active)]),
            pod("orders-1", false, &[]),
        ];
        assert_eq!(step(Some(2), 1, &down).replicas, 1);
        let unreported = [pod("orders-0", true, &[(0, TaskState::Active)])];
        assert_eq!(step(Some(2), 1, &unreported).replicas, 1);
        assert_eq!(step(Some(3), 1, &[]).replicas, 2, "no reports at all");
    }

    #[test]
    fn a_standby_or_warm_up_on_a_remaining_pod_is_not_a_take_over() {
        let reports = [
            pod(
                "orders-0",
                true,
                &[
                    (0, TaskState::Active),
                    (1, TaskState::Active),
                    (2, TaskState::Standby),
                ],
            ),
            pod(
                "orders-1",
                true,
                &[(3, TaskState::Active), (2, TaskState::WarmingUp)],
            ),
        ];
        let s = step(Some(2), 1, &reports);
        assert_eq!(s.replicas, 2);
        assert!(
            s.waiting.unwrap().ends_with("take over partition(s) 2"),
            "partition 2 has replicas only"
        );
    }

    #[test]
    fn reports_of_other_apps_with_a_common_prefix_are_ignored() {
        let reports = [
            pod(
                "orders-0",
                true,
                &[
                    (0, TaskState::Active),
                    (1, TaskState::Active),
                    (2, TaskState::Active),
                    (3, TaskState::Active),
                ],
            ),
            pod("orders-eu-0", true, &[(0, TaskState::Restoring)]),
        ];
        assert_eq!(step(Some(2), 1, &reports).replicas, 1);
    }

    #[test]
    fn only_members_of_pods_scaled_away_and_gone_are_departed() {
        let members: Vec<String> = [
            "orders-0",
            "orders-1",
            "orders-1-thread-1",
            "orders-2",
            "orders-2-thread-1",
            "orders-3",
            "other-5",
        ]
        .map(String::from)
        .to_vec();
        let pods = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // Scaled to 2: orders-2 and orders-3 are gone, both threads of orders-2 go.
        assert_eq!(
            departed_members("orders", 2, &members, &pods(&["orders-0", "orders-1"])),
            ["orders-2", "orders-2-thread-1", "orders-3"]
        );
        // orders-3 is still terminating (draining): it stays until its pod is gone.
        assert_eq!(
            departed_members(
                "orders",
                2,
                &members,
                &pods(&["orders-0", "orders-1", "orders-3"])
            ),
            ["orders-2", "orders-2-thread-1"]
        );
        // A pod that restarts within the replicas keeps its share: it comes back.
        assert!(departed_members("orders", 4, &members, &pods(&["orders-0"])).is_empty());
        // Scaled to zero (stopped, or reset): every member whose pod is gone.
        assert_eq!(
            departed_members("orders", 0, &members, &[]),
            members[..6].to_vec()
        );
    }
}
