//! The driver of `spec.nodeLoss`: observes the app's pods, the cluster's nodes, where the pods'
//! state volumes live and who is in the app's consumer group; asks
//! [`crate::node_loss::plan`] what to do; does it (a force-delete with the pod's UID as a
//! precondition, a claim deleted) and says so in an Event per step.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, ResourceExt};
use streamapp_api::config::pod_of_group_member;
use streamapp_api::crd::StreamApp;
use tracing::{info, warn};

use super::Context;
use super::objects::publish;
use crate::disruption_budget::max_unavailable_pods;
use crate::error::{Error, Result};
use crate::events::Notice;
use crate::kafka::Observation;
use crate::metrics::AppLabels;
use crate::node_loss::{self, Plan, Policy, Reason, Step, Volume};
use crate::statefulset::STATE_VOLUME;
use crate::status::NODE_LOSS;

const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Observes, plans and acts; returns the plan (its reason and message go into the status).
pub(super) async fn run(
    ctx: &Context,
    app: &StreamApp,
    pods: &[Pod],
    claims: &[PersistentVolumeClaim],
    seen: Option<&Observation>,
    replicas: i32,
) -> Result<Plan> {
    let nodes: Vec<Node> = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the nodes"))?
        .items;
    let nodes_by_name: BTreeMap<String, node_loss::Node> =
        nodes.iter().filter_map(node_of).collect();
    // Where volumes live matters only for pods of nodes that are not Ready (or gone): the
    // PersistentVolumes are read only then, not on every reconcile.
    let any_node_down = pods.iter().any(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none_or(|n| {
                nodes_by_name
                    .get(n)
                    .is_none_or(|n| !n.ready || n.out_of_service)
            })
    });
    let mut volumes = BTreeMap::new();
    for claim in claims.iter().filter(|_| any_node_down) {
        let Some(volume) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
            continue;
        };
        let pv = Api::<PersistentVolume>::all(ctx.client.clone())
            .get_opt(&volume)
            .await
            .map_err(Error::kube(format!("reading PersistentVolume {volume}")))?;
        volumes.insert(claim.name_any(), where_volume_lives(pv.as_ref(), &nodes));
    }
    let observed = node_loss::Observed {
        pods: pods.iter().map(|p| pod_of(p, &volumes)).collect(),
        nodes: nodes_by_name,
        live_members: seen
            .and_then(|s| s.static_members.as_ref().ok())
            .map(|members| {
                members
                    .iter()
                    .map(|m| pod_of_group_member(m).to_string())
                    .collect::<BTreeSet<_>>()
            }),
        budget: max_unavailable_pods(app, replicas),
    };
    let plan = node_loss::plan(
        &Policy::of(&app.spec.node_loss),
        &observed,
        Timestamp::now(),
    );
    for step in &plan.steps {
        execute(ctx, app, step, &plan.message).await?;
    }
    if plan.reason == Reason::Held && held_message(app) != Some(plan.message.as_str()) {
        publish(
            ctx,
            app,
            Notice {
                warning: true,
                reason: "HoldingPodOfLostNode",
                note: plan.message.clone(),
            },
        )
        .await;
    }
    Ok(plan)
}

/// The message of the `NodeLoss` condition when it last said a pod is held.
fn held_message(app: &StreamApp) -> Option<&str> {
    app.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == NODE_LOSS && c.reason == Reason::Held.as_str())
        .map(|c| c.message.as_str())
}

async fn execute(ctx: &Context, app: &StreamApp, step: &Step, why: &str) -> Result<()> {
    let ns = app.namespace().unwrap_or_default();
    match step {
        Step::ForceDelete { pod, uid } => {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                .delete(pod, &params)
                .await
            {
                Ok(_) => {}
                // Gone, or already another pod of that name: nothing of the lost one is left.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
                Err(e) => return Err(Error::kube(format!("force-deleting pod {ns}/{pod}"))(e)),
            }
            warn!(app = %app.name_any(), pod, uid, "force-deleted a pod of a lost node");
            ctx.metrics
                .lost_node_pods_replaced
                .get_or_create(&AppLabels {
                    namespace: ns.clone(),
                    name: app.name_any(),
                })
                .inc();
            publish(
                ctx,
                app,
                Notice {
                    warning: true,
                    reason: "ReplacedPodOfLostNode",
                    note: format!("force-deleted pod {pod} (UID {uid}): {why}"),
                },
            )
            .await;
        }
        Step::DeleteClaim { claim } => {
            match Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
                .delete(claim, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
                Err(e) => {
                    return Err(Error::kube(format!("deleting volume claim {ns}/{claim}"))(
                        e,
                    ));
                }
            }
            info!(app = %app.name_any(), claim, "deleted the claim of a volume on a lost node");
            publish(
                ctx,
                app,
                Notice {
                    warning: true,
                    reason: "RecreatedVolumeOfLostNode",
                    note: format!(
                        "deleted volume claim {claim}: its volume was only on a lost node; the new pod restores from a standby or the changelog"
                    ),
                },
            )
            .await;
        }
    }
    Ok(())
}

/// A node as the decision needs it; `None` for one without a name.
fn node_of(node: &Node) -> Option<(String, node_loss::Node)> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let out_of_service = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
    Some((
        node.metadata.name.clone()?,
        node_loss::Node {
            ready: ready.is_some_and(|c| c.status == "True"),
            ready_since: ready
                .and_then(|c| c.last_transition_time.as_ref())
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            out_of_service,
        },
    ))
}

/// Where a bound volume lives: pinned to one node when its node affinity names a single
/// hostname (a local volume), on the network otherwise.
fn where_volume_lives(pv: Option<&PersistentVolume>, nodes: &[Node]) -> Volume {
    let Some(pv) = pv else {
        return Volume::None;
    };
    let hostnames: Vec<&String> = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.iter())
        .into_iter()
        .flatten()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == HOSTNAME_LABEL && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten())
        .collect();
    match hostnames.as_slice() {
        [hostname] => {
            // The node whose hostname label it is (usually the node's name).
            let node = nodes
                .iter()
                .find(|n| n.labels().get(HOSTNAME_LABEL) == Some(*hostname))
                .map_or_else(|| (*hostname).clone(), |n| n.name_any());
            Volume::PinnedTo(node)
        }
        _ => Volume::Network,
    }
}

/// One of the app's pods as the decision needs it.
fn pod_of(pod: &Pod, volumes: &BTreeMap<String, Volume>) -> node_loss::Pod {
    let claim = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.iter().find(|v| v.name == STATE_VOLUME))
        .and_then(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone());
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    node_loss::Pod {
        name: pod.name_any(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready,
        volume: claim
            .as_ref()
            .and_then(|c| volumes.get(c).cloned())
            .unwrap_or(Volume::None),
        claim,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn node(name: &str, hostname: &str, ready: &str, since: &str) -> Node {
        from_json(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": hostname}},
            "status": {"conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": since}
            ]}
        }))
    }

    fn local_volume(hostname: &str) -> PersistentVolume {
        from_json(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}
            ]}]}}}
        }))
    }

    #[test]
    fn a_node_is_ready_since_its_condition_changed_and_out_of_service_by_its_taint() {
        let (name, n) = node_of(&node("n1", "n1", "Unknown", "2026-12-01T10:00:00Z")).unwrap();
        assert_eq!(name, "n1");
        assert!(!n.ready && !n.out_of_service);
        assert_eq!(n.ready_since.to_string(), "2026-12-01T10:00:00Z");
        let mut tainted = node("n2", "n2", "True", "2026-12-01T10:00:00Z");
        tainted.spec = Some(from_json(serde_json::json!({"taints": [
            {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}
        ]})));
        let (_, n) = node_of(&tainted).unwrap();
        assert!(n.ready && n.out_of_service);
    }

    #[test]
    fn a_volume_with_one_hostname_is_pinned_to_the_node_of_that_hostname_others_are_network() {
        let nodes = [
            node("node-a", "host-a", "True", "2026-12-01T10:00:00Z"),
            node("node-b", "host-b", "True", "2026-12-01T10:00:00Z"),
        ];
        assert_eq!(
            where_volume_lives(Some(&local_volume("host-b")), &nodes),
            Volume::PinnedTo("node-b".into())
        );
        assert_eq!(
            where_volume_lives(Some(&local_volume("gone")), &nodes),
            Volume::PinnedTo("gone".into()),
            "a deleted node's hostname is taken for its name"
        );
        let network: PersistentVolume = from_json(serde_json::json!({
            "metadata": {"name": "pv-2"}, "spec": {"csi": {"driver": "ebs", "volumeHandle": "v"}}
        }));
        assert_eq!(where_volume_lives(Some(&network), &nodes), Volume::Network);
        assert_eq!(where_volume_lives(None, &nodes), Volume::None);
    }

    #[test]
    fn a_pod_is_seen_with_its_node_readiness_and_the_volume_of_its_state_claim() {
        let pod: Pod = from_json(serde_json::json!({
            "metadata": {"name": "orders-0", "uid": "u-1"},
            "spec": {"nodeName": "node-a", "containers": [], "volumes": [
                {"name": "state", "persistentVolumeClaim": {"claimName": "state-orders-0"}}
            ]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }));
        let volumes = BTreeMap::from([(
            "state-orders-0".to_string(),
            Volume::PinnedTo("node-a".into()),
        )]);
        let seen = pod_of(&pod, &volumes);
        assert_eq!(
            seen,
            node_loss::Pod {
                name: "orders-0".into(),
                uid: "u-1".into(),
                node: Some("node-a".into()),
                ready: false,
                claim: Some("state-orders-0".into()),
                volume: Volume::PinnedTo("node-a".into()),
            }
        );
    }
}
