//! What to do about the app's pods on nodes that are gone (`spec.nodeLoss`).
//!
//! Kubernetes does almost nothing for a StatefulSet's pod on a node that died: the node turns
//! `Ready=Unknown`, the pod is evicted after its toleration and then stays `Terminating` until
//! someone force-deletes it (a StatefulSet never runs two pods of one identity), and with a
//! volume pinned to that node its replacement stays `Pending` until the claim is deleted too.
//! StreamApp can act safely where a generic operator cannot: Kafka fences the old pod (its
//! transactional id and its group generation), so replacing a pod whose node is unreachable
//! cannot duplicate or lose a record even if the old process still runs somewhere.
//!
//! [`plan`] decides, from plain values, what the reconcile driver then does: force-delete a
//! pod (with its UID as a precondition), delete the claim of a volume pinned to the lost node
//! (and a replacement already waiting for it), or hold and say why.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// Whether the operator replaces pods of lost nodes (`spec.nodeLoss.action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Replace,
    /// Kubernetes' own behaviour: an administrator force-deletes.
    Wait,
}

/// What to do with a claim of a volume pinned to a lost node (`spec.nodeLoss.localVolumes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalVolumes {
    /// Deleted with the pod: the replacement gets a new volume elsewhere and restores from a
    /// standby or the changelog.
    Recreate,
    /// Kept: the replacement waits for the node to come back.
    Keep,
}

/// `spec.nodeLoss`, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub action: Action,
    /// How long a node is not Ready before its pods count as lost.
    pub after: Duration,
    pub local_volumes: LocalVolumes,
}

impl Policy {
    /// The StreamApp's `spec.nodeLoss` (an `after` the CRD let through but that does not parse
    /// counts as the default).
    pub fn of(spec: &streamapp_api::crd::NodeLossSpec) -> Policy {
        use streamapp_api::crd::{LocalVolumesOnNodeLoss, NodeLossAction};
        let default = Policy::default();
        Policy {
            action: match spec.action {
                NodeLossAction::Replace => Action::Replace,
                NodeLossAction::Wait => Action::Wait,
            },
            after: streamapp_api::units::parse_duration(&spec.after).unwrap_or(default.after),
            local_volumes: match spec.local_volumes {
                LocalVolumesOnNodeLoss::Recreate => LocalVolumes::Recreate,
                LocalVolumesOnNodeLoss::Keep => LocalVolumes::Keep,
            },
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            action: Action::Replace,
            after: Duration::from_secs(60),
            local_volumes: LocalVolumes::Recreate,
        }
    }
}

/// A node as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// `Ready=True`.
    pub ready: bool,
    /// When the Ready condition last changed.
    pub ready_since: Timestamp,
    /// Tainted `node.kubernetes.io/out-of-service`: an administrator confirmed it is down.
    pub out_of_service: bool,
}

/// Where a pod's state volume lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Volume {
    /// No claim, or one not bound yet.
    None,
    /// A volume only one node can reach (a local PV, hostPath, a node-affine CSI volume).
    PinnedTo(String),
    /// A network volume: it follows the pod once detached.
    Network,
}

/// One of the app's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub uid: String,
    /// The node it was scheduled to; `None` while Pending.
    pub node: Option<String>,
    /// Ready (its processor answers /readyz).
    pub ready: bool,
    /// Its state volume's claim, and where that volume lives.
    pub claim: Option<String>,
    pub volume: Volume,
}

/// What the cluster and Kafka say, at one moment.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub pods: Vec<Pod>,
    /// Every node of the cluster by name (a node not in it was deleted). Fake nodes (kwok)
    /// are left out by the driver.
    pub nodes: BTreeMap<String, Node>,
    /// The pods that are live members of the app's consumer group; `None` when Kafka could not
    /// be asked.
    pub live_members: Option<BTreeSet<String>>,
    /// Pods the app may have unavailable at once (the disruption budget, resolved).
    pub budget: usize,
}

/// A step for the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Delete the pod at once (grace period 0), only if it still has this UID.
    ForceDelete { pod: String, uid: String },
    /// Delete the claim of a volume pinned to a lost node.
    DeleteClaim { claim: String },
}

/// The `NodeLoss` condition's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    AllNodesReady,
    /// Pods of lost nodes are being replaced.
    Replacing,
    /// A pod of a lost node is left where it is, and the message says why.
    Held,
    /// A replaced pod's network volume must be detached from the lost node first.
    WaitingForDetach,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AllNodesReady => "AllNodesReady",
            Reason::Replacing => "Replacing",
            Reason::Held => "Held",
            Reason::WaitingForDetach => "WaitingForDetach",
        }
    }
}

/// What the status says about lost nodes (the `NodeLoss` condition: `True` while pods of lost
/// nodes are replaced or held).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLossFinding {
    /// What the last [`plan`] decided.
    Planned { reason: Reason, message: String },
    /// The nodes or volumes could not be read (the error says which permission is missing).
    CannotObserve(String),
}

impl NodeLossFinding {
    /// The condition's status, reason and message.
    pub fn condition(&self) -> (&'static str, &'static str, String) {
        match self {
            NodeLossFinding::Planned {
                reason: Reason::AllNodesReady,
                ..
            } => ("False", Reason::AllNodesReady.as_str(), String::new()),
            NodeLossFinding::Planned { reason, message } => {
                ("True", reason.as_str(), message.clone())
            }
            NodeLossFinding::CannotObserve(why) => ("Unknown", "CannotObserveNodes", why.clone()),
        }
    }
}

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub reason: Reason,
    /// One sentence per pod of a lost node (empty with [`Reason::AllNodesReady`]).
    pub message: String,
    /// When to look again: a node that is not Ready yet for `after`.
    pub recheck_after: Option<Duration>,
}

/// Why a pod's node counts as lost, or since when it only may be.
enum NodeState {
    Fine,
    /// Not Ready, for less than `after` so far: lost at that time unless it comes back.
    Suspect {
        lost_in: Duration,
    },
    Lost(String),
}

fn node_state(policy: &Policy, name: &str, node: Option<&Node>, now: Timestamp) -> NodeState {
    let Some(node) = node else {
        return NodeState::Lost(format!("node {name} was deleted"));
    };
    if node.out_of_service {
        return NodeState::Lost(format!("node {name} is tainted out-of-service"));
    }
    if node.ready {
        return NodeState::Fine;
    }
    // Whole seconds, as the API server keeps them; a clock behind the condition's counts 0.
    let down_for = Duration::from_secs(
        u64::try_from(now.as_second() - node.ready_since.as_second()).unwrap_or(0),
    );
    if down_for < policy.after {
        return NodeState::Suspect {
            lost_in: policy.after - down_for,
        };
    }
    NodeState::Lost(format!(
        "node {name} has not been Ready for {}s",
        down_for.as_secs()
    ))
}

/// Decides what to do about the app's pods on lost nodes: a node deleted, tainted
/// `out-of-service`, or not Ready for `policy.after`.
///
/// - A pod that is still a live member of its consumer group is held: its node lost only the
///   API server, and its output flows.
/// - Nothing is done while most of the cluster's nodes are not Ready: the control plane, not
///   the nodes, is the likely fault; nor when Kafka cannot be asked.
/// - Otherwise the pod is force-deleted, at most `budget` pods unavailable at a time, and a
///   volume pinned to the lost node has its claim deleted (with [`LocalVolumes::Recreate`]),
///   also for a replacement that already waits for that volume.
pub fn plan(policy: &Policy, observed: &Observed, now: Timestamp) -> Plan {
    let mut lost = Vec::new();
    let mut recheck_after: Option<Duration> = None;
    for pod in &observed.pods {
        // A pod on a lost node, or a replacement pinned to one by its volume.
        let node = pod.node.as_deref().or(match &pod.volume {
            Volume::PinnedTo(n) => Some(n.as_str()),
            _ => None,
        });
        let Some(node) = node else { continue };
        match node_state(policy, node, observed.nodes.get(node), now) {
            NodeState::Fine => {}
            NodeState::Suspect { lost_in } => {
                recheck_after = Some(recheck_after.map_or(lost_in, |r| r.min(lost_in)));
            }
            NodeState::Lost(why) => lost.push((pod, why)),
        }
    }
    if lost.is_empty() {
        return Plan {
            steps: Vec::new(),
            reason: Reason::AllNodesReady,
            message: String::new(),
            recheck_after,
        };
    }
    let held = |message: String| Plan {
        steps: Vec::new(),
        reason: Reason::Held,
        message,
        recheck_after,
    };
    let names = |pods: &[(&Pod, String)]| {
        pods.iter()
            .map(|(p, why)| format!("{} ({why})", p.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if policy.action == Action::Wait {
        return held(format!(
            "spec.nodeLoss.action is Wait: {} left for an administrator to force-delete",
            names(&lost)
        ));
    }
    let not_ready = observed.nodes.values().filter(|n| !n.ready).count();
    if observed.nodes.is_empty() || not_ready * 2 > observed.nodes.len() {
        return held(format!(
            "{not_ready} of {} nodes are not Ready at once: the control plane, not the nodes, \
             is the likely fault; nothing is replaced ({})",
            observed.nodes.len(),
            names(&lost)
        ));
    }
    let Some(live) = &observed.live_members else {
        return held(format!(
            "Kafka could not be asked whether {} still run: nothing is replaced until it answers",
            names(&lost)
        ));
    };

    let mut steps = Vec::new();
    let mut sentences = Vec::new();
    let mut reason = Reason::Held;
    // Pods down for other reasons count against the budget; so does each one replaced now.
    let lost_names: BTreeSet<&str> = lost.iter().map(|(p, _)| p.name.as_str()).collect();
    let mut unavailable = observed
        .pods
        .iter()
        .filter(|p| !p.ready && !lost_names.contains(p.name.as_str()))
        .count();
    for (pod, why) in &lost {
        if live.contains(&pod.name) {
            sentences.push(format!(
                "{} is held: {why}, but it is still a live member of its consumer group (the \
                 node lost only the API server) and its output flows",
                pod.name
            ));
            continue;
        }
        if unavailable >= observed.budget.max(1) {
            sentences.push(format!(
                "{} waits: {why}, and {unavailable} pods are unavailable already (the \
                 disruption budget allows {})",
                pod.name,
                observed.budget.max(1)
            ));
            continue;
        }
        unavailable += 1;
        // A pending replacement has nothing to delete but its claim and itself.
        steps.push(Step::ForceDelete {
            pod: pod.name.clone(),
            uid: pod.uid.clone(),
        });
        let mut sentence = format!(
            "{} is replaced: {why}; Kafka fences the old process",
            pod.name
        );
        match (&pod.volume, &pod.claim, policy.local_volumes) {
            (Volume::PinnedTo(_), Some(claim), LocalVolumes::Recreate) => {
                steps.push(Step::DeleteClaim {
                    claim: claim.clone(),
                });
                sentence += &format!(
                    "; its volume was only on that node: claim {claim} is deleted, the new pod \
                     restores from a standby or the changelog"
                );
                reason = reason_max(reason, Reason::Replacing);
            }
            (Volume::PinnedTo(_), _, LocalVolumes::Keep) => {
                sentence += "; its volume is only on that node and spec.nodeLoss.localVolumes \
                             is Keep: the new pod waits for the node";
                reason = reason_max(reason, Reason::Replacing);
            }
            (Volume::Network, _, _) => {
                sentence += "; its network volume is attached to that node until Kubernetes \
                             detaches it";
                reason = reason_max(reason, Reason::WaitingForDetach);
            }
            _ => reason = reason_max(reason, Reason::Replacing),
        }
        sentences.push(sentence);
    }
    Plan {
        steps,
        reason,
        message: sentences.join("; "),
        recheck_after,
    }
}

/// The reason that says the most: waiting for a detach over replacing over holding.
fn reason_max(a: Reason, b: Reason) -> Reason {
    let rank = |r: Reason| match r {
        Reason::AllNodesReady => 0,
        Reason::Held => 1,
        Reason::Replacing => 2,
        Reason::WaitingForDetach => 3,
    };
    if rank(b) > rank(a) { b } else { a }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn node(ready: bool, since: i64) -> Node {
        Node {
            ready,
            ready_since: t(since),
            out_of_service: false,
        }
    }

    fn pod(i: usize, node: &str, volume: Volume) -> Pod {
        Pod {
            name: format!("app-{i}"),
            uid: format!("uid-{i}"),
            node: Some(node.into()),
            ready: true,
            claim: Some(format!("state-app-{i}")),
            volume,
        }
    }

    /// Three nodes, a pod on each with a local volume; node b went NotReady at t(0).
    fn three_nodes() -> Observed {
        Observed {
            pods: ["a", "b", "c"]
                .iter()
                .enumerate()
                .map(|(i, n)| pod(i, n, Volume::PinnedTo(n.to_string())))
                .collect(),
            nodes: BTreeMap::from([
                ("a".into(), node(true, -500)),
                ("b".into(), node(false, 0)),
                ("c".into(), node(true, -500)),
            ]),
            live_members: Some(BTreeSet::from(["app-0".into(), "app-2".into()])),
            budget: 1,
        }
    }

    #[test]
    fn the_spec_resolves_to_the_policy_and_its_defaults_are_replace_after_a_minute_recreate() {
        use streamapp_api::crd::{LocalVolumesOnNodeLoss, NodeLossAction, NodeLossSpec};
        assert_eq!(Policy::of(&NodeLossSpec::default()), Policy::default());
        let spec = NodeLossSpec {
            action: NodeLossAction::Wait,
            after: "2m30s".into(),
            local_volumes: LocalVolumesOnNodeLoss::Keep,
        };
        assert_eq!(
            Policy::of(&spec),
            Policy {
                action: Action::Wait,
                after: Duration::from_secs(150),
                local_volumes: LocalVolumes::Keep,
            }
        );
    }

    #[test]
    fn a_node_not_ready_for_less_than_after_is_looked_at_again_when_it_would_be_lost() {
        let plan = plan(&Policy::default(), &three_nodes(), t(20));
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.reason, Reason::AllNodesReady);
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(40)));
    }

    #[test]
    fn a_pod_of_a_lost_node_is_force_deleted_with_its_uid_and_its_local_claim_goes_too() {
        let plan = plan(&Policy::default(), &three_nodes(), t(61));
        assert_eq!(
            plan.steps,
            vec![
                Step::ForceDelete {
                    pod: "app-1".into(),
                    uid: "uid-1".into()
                },
                Step::DeleteClaim {
                    claim: "state-app-1".into()
                },
            ]
        );
        assert_eq!(plan.reason, Reason::Replacing);
        assert!(
            plan.message
                .starts_with("app-1 is replaced: node b has not been Ready for 61s"),
            "{}",
            plan.message
        );
    }

    #[test]
    fn a_deleted_or_out_of_service_node_is_lost_at_once() {
        let mut observed = three_nodes();
        observed.nodes.remove("b");
        let deleted = plan(&Policy::default(), &observed, t(1));
        assert_eq!(deleted.reason, Reason::Replacing);
        assert!(deleted.message.contains("node b was deleted"));

        let mut observed = three_nodes();
        observed.nodes.get_mut("b").unwrap().out_of_service = true;
        let tainted = plan(&Policy::default(), &observed, t(1));
        assert_eq!(tainted.steps.len(), 2);
        assert!(tainted.message.contains("tainted out-of-service"));
    }

    #[test]
    fn a_pod_still_in_its_consumer_group_is_held_because_its_output_flows() {
        let mut observed = three_nodes();
        observed
            .live_members
            .as_mut()
            .unwrap()
            .insert("app-1".into());
        let plan = plan(&Policy::default(), &observed, t(120));
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.reason, Reason::Held);
        assert!(
            plan.message
                .contains("still a live member of its consumer group")
        );
    }

    #[test]
    fn nothing_is_replaced_when_kafka_cannot_be_asked_or_most_nodes_are_down_at_once() {
        let mut observed = three_nodes();
        observed.live_members = None;
        let unasked = plan(&Policy::default(), &observed, t(120));
        assert_eq!((unasked.steps.len(), unasked.reason), (0, Reason::Held));
        assert!(unasked.message.contains("Kafka could not be asked"));

        let mut observed = three_nodes();
        observed.nodes.get_mut("c").unwrap().ready = false;
        observed.live_members = Some(BTreeSet::new());
        let most = plan(&Policy::default(), &observed, t(120));
        assert_eq!((most.steps.len(), most.reason), (0, Reason::Held));
        assert!(most.message.contains("2 of 3 nodes are not Ready at once"));
    }

    #[test]
    fn wait_leaves_the_pod_to_an_administrator() {
        let policy = Policy {
            action: Action::Wait,
            ..Policy::default()
        };
        let plan = plan(&policy, &three_nodes(), t(600));
        assert_eq!((plan.steps.len(), plan.reason), (0, Reason::Held));
        assert!(plan.message.contains("spec.nodeLoss.action is Wait"));
    }

    #[test]
    fn keep_replaces_the_pod_and_leaves_its_local_claim() {
        let policy = Policy {
            local_volumes: LocalVolumes::Keep,
            ..Policy::default()
        };
        let plan = plan(&policy, &three_nodes(), t(61));
        assert_eq!(
            plan.steps,
            vec![Step::ForceDelete {
                pod: "app-1".into(),
                uid: "uid-1".into()
            }]
        );
        assert!(plan.message.contains("the new pod waits for the node"));
    }

    #[test]
    fn a_network_volume_is_left_alone_and_its_detach_awaited() {
        let mut observed = three_nodes();
        observed.pods[1].volume = Volume::Network;
        let plan = plan(&Policy::default(), &observed, t(61));
        assert_eq!(plan.steps.len(), 1, "{:?}", plan.steps);
        assert_eq!(plan.reason, Reason::WaitingForDetach);
    }

    #[test]
    fn a_replacement_pending_on_a_claim_pinned_to_the_lost_node_loses_both() {
        let mut observed = three_nodes();
        // The StatefulSet recreated app-1 before its claim went: Pending, no node.
        observed.pods[1].node = None;
        observed.pods[1].uid = "uid-1-new".into();
        observed.pods[1].ready = false;
        let plan = plan(&Policy::default(), &observed, t(90));
        assert_eq!(
            plan.steps,
            vec![
                Step::ForceDelete {
                    pod: "app-1".into(),
                    uid: "uid-1-new".into()
                },
                Step::DeleteClaim {
                    claim: "state-app-1".into()
                },
            ]
        );
    }

    #[test]
    fn the_disruption_budget_bounds_the_pods_replaced_at_once() {
        let mut observed = three_nodes();
        // Five nodes so that two lost ones are not most of them; app-2 is down already.
        observed.nodes.insert("d".into(), node(true, -500));
        observed.nodes.insert("e".into(), node(true, -500));
        observed
            .pods
            .push(pod(3, "d", Volume::PinnedTo("d".into())));
        observed.nodes.get_mut("d").unwrap().ready = false;
        observed.nodes.get_mut("d").unwrap().ready_since = t(0);
        observed.pods[2].ready = false;
        let held = plan(&Policy::default(), &observed, t(61));
        assert_eq!(held.steps, vec![], "app-2 takes the budget of one");
        assert!(held.message.contains("1 pods are unavailable already"));

        observed.pods[2].ready = true;
        observed.budget = 1;
        let one = plan(&Policy::default(), &observed, t(61));
        let deleted: Vec<_> = one
            .steps
            .iter()
            .filter(|s| matches!(s, Step::ForceDelete { .. }))
            .collect();
        assert_eq!(deleted.len(), 1, "one at a time: {:?}", one.steps);
        assert!(one.message.contains("app-3 waits"), "{}", one.message);
    }
}
