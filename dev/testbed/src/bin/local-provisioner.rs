//! The test bed's storage: a dynamic provisioner for StorageClasses whose provisioner is
//! `streamapp.dev/local-provisioner`.
//!
//! There is no CSI driver on the test bed, so this plays its part the way external-provisioner
//! and external-resizer would for a real driver (and the way local-path provisioners work):
//! - a pending claim of such a class gets a PersistentVolume, pre-bound to it, whose directory is
//!   `<volumes-dir>/<pv-name>`: with `volumeBindingMode: WaitForFirstConsumer` (the test bed's
//!   class) a `local` volume on the node the scheduler picked for the claim's first pod (the
//!   kubelet mounts it and applies the pod's fsGroup); with `Immediate` a hostPath volume;
//! - a bound claim whose request grew has its volume and its status capacity raised;
//! - a released volume with reclaim policy Delete is deleted, directory and all — a local one
//!   only while its node is Ready: its directory is that node's disk, which only the node
//!   itself can wipe (as a real local-volume deleter runs on the node), so a dead node's volumes
//!   stay until it is back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::json;
use streamapp_api::units::parse_quantity;
use tracing::{info, warn};

const PROVISIONER: &str = "streamapp.dev/local-provisioner";
/// Set on a claim by the scheduler once it picked a node for the claim's first pod.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

#[derive(Parser)]
#[command(about = "Provisions local PersistentVolumes for the local test bed")]
struct Args {
    /// Kubeconfig of the local API server.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Where volume directories are created.
    #[arg(long)]
    volumes_dir: PathBuf,
    /// How often claims and volumes are looked at.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    interval: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("not a duration: {s}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        _ => Err(format!("not a duration: {s} (use ms or s)")),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    std::fs::create_dir_all(&args.volumes_dir)?;
    info!(volumes_dir = %args.volumes_dir.display(), "local provisioner running");
    // Released volumes already announced as waiting for their node.
    let mut waiting = BTreeSet::new();
    loop {
        if let Err(e) = pass(&client, &args, &mut waiting).await {
            warn!(error = %format!("{e:#}"), "provisioning pass failed; retrying");
        }
        tokio::time::sleep(args.interval).await;
    }
}

/// One look at every claim and volume.
async fn pass(client: &Client, args: &Args, waiting: &mut BTreeSet<String>) -> Result<()> {
    let classes: BTreeMap<String, StorageClass> = Api::<StorageClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.provisioner == PROVISIONER)
        .map(|c| (c.name_any(), c))
        .collect();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for claim in claims.items {
        let spec = claim.spec.clone().unwrap_or_default();
        let Some(class) = spec
            .storage_class_name
            .as_ref()
            .and_then(|c| classes.get(c))
        else {
            continue;
        };
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match spec.volume_name.as_deref() {
            None | Some("") => provision(client, &pvs, &claim, class, args).await?,
            Some(pv_name) => resize(client, &pvs, &claim, pv_name).await?,
        }
    }
    let volumes = pvs.list(&ListParams::default()).await?.items;
    // The nodes matter only to a released local volume: listed only when there is one.
    let ready_hosts = if volumes
        .iter()
        .any(|pv| matches!(cleanup(pv, &BTreeSet::new()), Cleanup::WaitForNode(_)))
    {
        ready_hostnames(client).await?
    } else {
        BTreeSet::new()
    };
    for pv in volumes {
        match cleanup(&pv, &ready_hosts) {
            Cleanup::Keep => {}
            Cleanup::WaitForNode(host) => {
                if waiting.insert(pv.name_any()) {
                    info!(pv = %pv.name_any(), node = %host, "released volume kept until its node is Ready");
                }
            }
            Cleanup::Delete => {
                let dir = args.volumes_dir.join(pv.name_any());
                let _ = std::fs::remove_dir_all(&dir);
                pvs.delete(&pv.name_any(), &DeleteParams::default()).await?;
                waiting.remove(&pv.name_any());
                info!(pv = %pv.name_any(), "deleted released volume");
            }
        }
    }
    Ok(())
}

/// What becomes of a volume.
#[derive(Debug, PartialEq, Eq)]
enum Cleanup {
    /// Not ours, not released, or kept by its reclaim policy.
    Keep,
    /// Released, to be deleted, but on a node that is not Ready (its hostname).
    WaitForNode(String),
    Delete,
}

fn cleanup(pv: &PersistentVolume, ready_hosts: &BTreeSet<String>) -> Cleanup {
    let ours = pv
        .annotations()
        .get("pv.kubernetes.io/provisioned-by")
        .map(String::as_str)
        == Some(PROVISIONER);
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let spec = pv.spec.as_ref();
    let delete = spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete");
    if !(ours && released && delete) || pv.metadata.deletion_timestamp.is_some() {
        return Cleanup::Keep;
    }
    match spec.and_then(local_volume_host) {
        Some(host) if !ready_hosts.contains(&host) => Cleanup::WaitForNode(host),
        _ => Cleanup::Delete,
    }
}

/// The hostname a local volume's node affinity names (hostPath volumes have none).
fn local_volume_host(spec: &PersistentVolumeSpec) -> Option<String> {
    spec.local.as_ref()?;
    spec.node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .and_then(|e| e.values.as_ref()?.first().cloned())
}

/// The `kubernetes.io/hostname` of every node whose Ready condition is True.
async fn ready_hostnames(client: &Client) -> Result<BTreeSet<String>> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(nodes
        .items
        .iter()
        .filter(|n| testbed::node::is_ready(n))
        .map(|n| {
            n.labels()
                .get("kubernetes.io/hostname")
                .cloned()
                .unwrap_or_else(|| n.name_any())
        })
        .collect())
}

fn requested(claim: &PersistentVolumeClaim) -> Option<Quantity> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .cloned()
}

async fn provision(
    client: &Client,
    pvs: &Api<PersistentVolume>,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    args: &Args,
) -> Result<()> {
    let ns = claim.namespace().unwrap_or_default();
    let uid = claim.uid().context("claim without uid")?;
    let name = format!("pvc-{uid}");
    if pvs.get_opt(&name).await?.is_some() {
        return Ok(()); // made in an earlier pass; the binder will catch up
    }
    let size = requested(claim).context("claim without a storage request")?;
    let wait_for_consumer = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
    let node = claim.annotations().get(SELECTED_NODE).cloned();
    if wait_for_consumer && node.is_none() {
        return Ok(()); // the scheduler has not placed the claim's first pod yet
    }
    let dir = args.volumes_dir.join(&name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let spec = claim.spec.clone().unwrap_or_default();
    let source = match &node {
        // A local volume is bound to its node: pods using it are scheduled there.
        Some(node) => {
            let hostname = hostname_of(client, node).await?;
            json!({
                "local": { "path": dir },
                "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                    { "key": "kubernetes.io/hostname", "operator": "In", "values": [hostname] }
                ] }] } },
            })
        }
        None => json!({ "hostPath": { "path": dir, "type": "DirectoryOrCreate" } }),
    };
    let mut pv_spec = json!({
        "capacity": { "storage": size },
        "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
        "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
        "storageClassName": class.name_any(),
        "volumeMode": spec.volume_mode.unwrap_or_else(|| "Filesystem".into()),
        "claimRef": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": ns, "name": claim.name_any(), "uid": uid,
        },
    });
    for (k, v) in source.as_object().expect("an object") {
        pv_spec[k] = v.clone();
    }
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": { "pv.kubernetes.io/provisioned-by": PROVISIONER },
        },
        "spec": pv_spec,
    }))?;
    pvs.create(&PostParams::default(), &pv).await?;
    info!(namespace = %ns, claim = %claim.name_any(), pv = %name, size = %size.0, node = ?node, "provisioned volume");
    Ok(())
}

/// The `kubernetes.io/hostname` label of a node, which local volumes' node affinity names.
async fn hostname_of(client: &Client, node: &str) -> Result<String> {
    let node_obj = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .with_context(|| format!("reading node {node}"))?;
    Ok(node_obj
        .labels()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(|| node.to_string()))
}

/// Grows a bound volume to its claim's new request, as an online-expanding driver would.
async fn resize(
    client: &Client,
    pvs: &Api<PersistentVolume>,
    claim: &PersistentVolumeClaim,
    pv_name: &str,
) -> Result<()> {
    let Some(want) = requested(claim) else {
        return Ok(());
    };
    let have = claim
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .cloned();
    let Some(have) = have else { return Ok(()) }; // not bound yet
    if parse_quantity(&want.0).map_err(anyhow::Error::msg)?
        <= parse_quantity(&have.0).map_err(anyhow::Error::msg)?
    {
        return Ok(());
    }
    let ns = claim.namespace().unwrap_or_default();
    let pp = PatchParams::default();
    pvs.patch(
        pv_name,
        &pp,
        &Patch::Merge(json!({ "spec": { "capacity": { "storage": want } } })),
    )
    .await?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .patch_status(
            &claim.name_any(),
            &pp,
            &Patch::Merge(json!({ "status": { "capacity": { "storage": want }, "allocatedResources": { "storage": want } } })),
        )
        .await?;
    info!(namespace = %ns, claim = %claim.name_any(), from = %have.0, to = %want.0, "expanded volume");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(source: serde_json::Value) -> PersistentVolume {
        let mut spec = json!({ "persistentVolumeReclaimPolicy": "Delete" });
        for (k, v) in source.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "pvc-1",
                "annotations": { "pv.kubernetes.io/provisioned-by": PROVISIONER },
            },
            "spec": spec,
            "status": { "phase": "Released" },
        }))
        .unwrap()
    }

    fn local_on(host: &str) -> PersistentVolume {
        released(json!({
            "local": { "path": "/v/pvc-1" },
            "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": [host] }
            ] }] } },
        }))
    }

    #[test]
    fn a_released_local_volume_is_deleted_only_while_its_node_is_ready() {
        let ready: BTreeSet<String> = ["node-1".to_string()].into();
        assert_eq!(cleanup(&local_on("node-1"), &ready), Cleanup::Delete);
        assert_eq!(
            cleanup(&local_on("node-2"), &ready),
            Cleanup::WaitForNode("node-2".into())
        );
    }

    #[test]
    fn a_released_host_path_volume_is_deleted_whatever_the_nodes() {
        let pv = released(json!({ "hostPath": { "path": "/v/pvc-1" } }));
        assert_eq!(cleanup(&pv, &BTreeSet::new()), Cleanup::Delete);
    }

    #[test]
    fn bound_retained_and_foreign_volumes_are_kept() {
        let ready: BTreeSet<String> = ["node-1".to_string()].into();
        let mut bound = local_on("node-1");
        bound.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(cleanup(&bound, &ready), Cleanup::Keep);
        let mut retained = local_on("node-1");
        retained
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(cleanup(&retained, &ready), Cleanup::Keep);
        let mut foreign = local_on("node-1");
        foreign.metadata.annotations = None;
        assert_eq!(cleanup(&foreign, &ready), Cleanup::Keep);
    }
}
